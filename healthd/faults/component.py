"""The health component: the probes over every Snapshot and the XID watcher (the two sources of findings), the
fault pipeline they feed (engine, journal, hook outbox), the Health service and their metrics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from exporter.backends.guarded import GuardedBackend
from exporter.collectors.base import Collector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler
from healthd.faults import service as health_service
from healthd.faults.journal import Journal
from healthd.faults.runtime import JOURNAL_FILE, FaultRuntime
from healthd.faults.settings import FaultsSettings, HookSettings
from healthd.host.view import HostView
from healthd.probes import HealthSettings, default_probes
from healthd.probes.metrics import ProbeCollector
from healthd.probes.runner import ProbeRunner
from healthd.rpc.server import Service
from healthd.xid.metrics import XidCollector
from healthd.xid.watcher import build_watcher


class HealthComponent:
    name = "health"

    def __init__(
        self,
        faults: FaultsSettings,
        hook: HookSettings,
        health: HealthSettings,
        device: GuardedBackend,
        sampler: Sampler,
        host: HostView,
        state_dir: Path,
    ) -> None:
        self.runtime = FaultRuntime(Journal(state_dir / JOURNAL_FILE), faults, hook)
        self.engine = self.runtime.engine  # the probes' sink: report(ProbeReport), event(Finding)
        self.probes = ProbeRunner(default_probes(health, host.probes), self.engine)
        sampler.subscribe(self.probes.on_snapshot, "probes")
        self.xid = build_watcher(health.xid, device, self.engine, sampler.latest, host.kmsg_path)

    def collectors(self) -> Sequence[Collector]:
        return [
            self.runtime.collector,
            ProbeCollector(self.probes),
            XidCollector(self.xid),
        ]

    def services(self) -> Sequence[Service]:
        return [
            Service(health_service.SERVICE_NAME, self.runtime.service, health_service.add_to_server),
            Service(health_service.SERVICE_NAME, self.runtime.admin_service, health_service.add_to_server, admin=True),
        ]

    async def start(self) -> None:
        await self.runtime.start()
        self.xid.start()

    async def stop(self) -> None:
        await in_daemon_thread(self.xid.stop, 1.0)  # before the driver closes: it waits on the driver's event set
        await self.runtime.stop(flush_seconds=3.0)
