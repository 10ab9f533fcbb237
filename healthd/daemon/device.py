"""The device component: the driver behind its lanes (exporter/backends/guarded.py) and the sampler over it.

Started first and stopped last: everything else reads its Snapshots or calls the driver through it. Stopping
never waits on the driver: calls still stuck in it are named in the log and left behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeadlineSettings, DeviceAccess
from exporter.backends.protocol import Backend
from exporter.collectors.base import Collector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler, SamplerConfig
from exporter.settings import option
from healthd.rpc.server import Service

log = structlog.get_logger("device")

FIRST_SAMPLE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    """[sampler]: how often the cards are read, and how long a driver call may take."""

    interval_seconds: float = option(5.0, min=0.1, max=3600)
    call_deadline_seconds: float = option(2.0, min=0.05, max=600)  # every driver read, by anyone
    change_deadline_seconds: float = option(20.0, min=0.05, max=600)  # MIG instance create/destroy


class DeviceComponent:
    name = "device"

    def __init__(self, settings: SamplerSettings, backend: Backend) -> None:
        deadlines = DeadlineSettings(
            read_seconds=settings.call_deadline_seconds, change_seconds=settings.change_deadline_seconds
        )
        self.device = GuardedBackend(DeviceAccess(backend, deadlines))  # the only way to the driver
        self.sampler = Sampler(self.device, SamplerConfig(settings.interval_seconds))

    def collectors(self) -> Sequence[Collector]:
        return ()

    def services(self) -> Sequence[Service]:
        return ()

    async def start(self) -> None:
        self.sampler.start()
        await in_daemon_thread(self.sampler.wait_first, FIRST_SAMPLE_SECONDS)

    async def stop(self) -> None:
        await in_daemon_thread(self.sampler.stop, 2.0)
        await in_daemon_thread(self._close_driver)
        access = self.device.access
        hung = access.shutdown(0.0)
        if hung:
            now = access.now()
            log.warning("exiting with driver calls that never returned", calls=[h.describe(now) for h in hung])

    def _close_driver(self) -> None:
        try:
            self.device.close()
        except BackendError as exc:
            log.warning("driver library not closed", error=str(exc))
