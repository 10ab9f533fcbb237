"""The device component: the driver behind its lanes (exporter/backends/guarded.py) and the sampler over it.

Started first and stopped last: everything else reads its Snapshots or calls the driver through it. Stopping
never waits on the driver: calls still stuck in it are named in the log and left behind.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.collectors.base import Collector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler, SamplerSettings
from healthd.rpc.server import Service

log = structlog.get_logger("device")

FIRST_SAMPLE_SECONDS = 30.0


class DeviceComponent:
    name = "device"

    def __init__(self, settings: SamplerSettings, backend: Backend) -> None:
        self.device = GuardedBackend(DeviceAccess(backend, settings))  # the only way to the driver
        self.sampler = Sampler(self.device, settings)

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
