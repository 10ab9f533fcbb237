"""The health component: the fault pipeline (journal, engine, hook dispatcher, Health service, the engine's tick)
and, on a node, the two sources of findings that feed it: the probes over every Snapshot and the XID watcher. It
answers the node's fault questions: the active faults and check results as committed, and the write backlogs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.collectors.base import Collector
from exporter.executor import SerialExecutor, in_daemon_thread
from exporter.sampler import Sampler
from exporter.supervision import Workers
from healthd.component import ComponentBase
from healthd.daemon.config import DaemonSettings
from healthd.faults import service as health_service
from healthd.faults.engine import CheckState, FaultEngine
from healthd.faults.escalation import read_boot_id
from healthd.faults.fault import Fault, HookDelivery
from healthd.faults.journal import Journal
from healthd.faults.metrics import FaultMetricsCollector
from healthd.faults.notify import CommitSignal
from healthd.faults.outbox import HookDispatcher
from healthd.faults.service import HealthService
from healthd.faults.settings import FaultsSettings, HookSettings
from healthd.findings import Action
from healthd.host.view import HostView
from healthd.node import Node
from healthd.node_name import canonical_node_name
from healthd.probes import HealthSettings, default_probes
from healthd.probes.metrics import ProbeCollector
from healthd.probes.runner import ProbeRunner
from healthd.rpc.server import Service
from healthd.xid.kmsg_cursor import CURSOR_FILE, KmsgCursor
from healthd.xid.metrics import XidCollector
from healthd.xid.watcher import XidWatcher, build_watcher

log = structlog.get_logger("faults")

JOURNAL_FILE = "faults.sqlite"
TICK_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class FindingSources:
    """What the probes and the XID watcher read on a node: [health], the driver, the Snapshots, the host's files."""

    health: HealthSettings
    device: GuardedBackend
    sampler: Sampler
    host: HostView
    workers: Workers | None = None  # the node's supervised threads (the XID watcher's run under it)
    state_dir: Path | None = None  # where the kernel-log reader keeps its position (None: not kept)
    give_way: Callable[[], None] = lambda: None  # called before each probe (the requests in flight: inflight.py)


class HealthComponent(ComponentBase):
    """``engine`` is the sink the probe runner and the XID watcher call (``report()``/``event()``), from the loop or
    any thread. Without ``sources`` it is the fault pipeline alone, fed by whoever holds ``engine``."""

    name = "health"

    def __init__(
        self,
        journal: Journal,
        faults: FaultsSettings,
        hook: HookSettings,
        sources: FindingSources | None = None,
        *,
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
        node_name: str = "",
    ) -> None:
        """``node_name``: the node's canonical name (healthd/node_name.py); empty: worked out from [hook], the
        environment and the host name."""
        self.journal = journal
        self.node_name = node_name or canonical_node_name(hook.node_name)
        self.engine = FaultEngine(
            journal,
            faults,
            boot_id=boot_id if boot_id is not None else read_boot_id(faults.boot_id_path),
            hook_targets=hook.endpoints,
            hook_min_action=Action[hook.min_action.upper()],
            clock=clock,
        )
        self.signal = CommitSignal(journal.last_seq)
        self.engine.add_listener(self.signal.notify)
        self.io = SerialExecutor("journal-io")  # journal reads, outbox updates and the engine tick, off the loop
        self.dispatcher = HookDispatcher(journal, hook, self.signal, self.io, node_name=self.node_name, clock=clock)
        self.service = HealthService(self.engine, self.signal, self.io)
        self.admin_service = HealthService(self.engine, self.signal, self.io, writable=True)  # on the admin socket
        self.collector = FaultMetricsCollector(self.engine, self.dispatcher, node_name=self.node_name)
        self.probes: ProbeRunner | None = None
        self.xid: XidWatcher | None = None
        if sources is not None:
            s = sources
            self.probes = ProbeRunner(default_probes(s.health, s.host.probes), self.engine, checkpoint=s.give_way)
            s.sampler.subscribe(self.probes.on_snapshot, "probes")
            cursor = KmsgCursor(s.state_dir / CURSOR_FILE, self.engine.boot_id) if s.state_dir is not None else None
            self.xid = build_watcher(
                s.health.xid,
                s.device,
                self.engine,
                s.sampler.latest,
                s.host.kmsg_path,
                workers=s.workers,
                kmsg_cursor=cursor,
            )
        self._ticker: asyncio.Task[None] | None = None

    def collectors(self) -> Sequence[Collector]:
        found: list[Collector] = [self.collector]
        if self.probes is not None:
            found.append(ProbeCollector(self.probes))
        if self.xid is not None:
            found.append(XidCollector(self.xid))
        return found

    def services(self) -> Sequence[Service]:
        return [
            Service(health_service.SERVICE_NAME, self.service, health_service.add_to_server),
            Service(health_service.SERVICE_NAME, self.admin_service, health_service.add_to_server, admin=True),
        ]

    def active_faults(self) -> list[Fault]:
        return self.engine.active_faults()

    def check_states(self) -> list[CheckState]:
        return self.engine.check_states()

    def hook_deliveries(self) -> Sequence[HookDelivery]:
        return self.dispatcher.deliveries

    def backlogs(self) -> dict[str, int]:
        """Work queued behind a slow disk or an unreachable hook (the node status shows it)."""
        return {"hook outbox": sum(self.dispatcher.depth.values()), "journal": self.io.backlog()}

    async def start(self) -> None:
        self.signal.attach(asyncio.get_running_loop())
        self.dispatcher.start()
        self._ticker = asyncio.create_task(self._tick_forever(), name="fault engine tick")
        if self.xid is not None:
            self.xid.start()

    async def stop(self, flush_seconds: float = 3.0) -> None:
        """Stop the XID watcher, delivering and ticking, let queued journal work finish (at most ``flush_seconds``),
        close the journal."""
        if self.xid is not None:  # before the driver closes: it waits on the driver's event set
            await in_daemon_thread(self.xid.stop, 1.0)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.dispatcher.stop()
        # after what is queued; the journal's own lock waits out a commit that is in flight on another thread
        closed = asyncio.wrap_future(self.io.submit(self.journal.close))
        done, _ = await asyncio.wait({closed}, timeout=flush_seconds)
        self.io.shutdown(wait=False)
        if not done:
            log.warning("journal work still running at stop; left to finish", seconds=flush_seconds)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.io, self.engine.tick)
            except Exception:
                log.exception("fault engine tick failed")
            await asyncio.sleep(TICK_SECONDS)


def build(node: Node) -> HealthComponent:
    sources = FindingSources(
        node.settings(HealthSettings),
        node.device,
        node.sampler,
        node.host,
        node.workers,
        node.state_dir,
        give_way=node.requests.give_way,
    )
    journal = Journal(node.state_dir / JOURNAL_FILE)
    hook = node.settings(HookSettings)
    name = canonical_node_name(node.settings(DaemonSettings).node_name, hook.node_name)
    component = HealthComponent(journal, node.settings(FaultsSettings), hook, sources, clock=node.clock, node_name=name)
    node.answer(faults=component)
    return component
