"""The device component: runs the sampler over the node's device lanes (exporter/backends/guarded.py) and closes
the driver at the end.

Started before every component that reads Snapshots or calls the driver, and stopped after them (the simulated
node and attribution's kubelet client, which need no driver, come before it and outlast it). Stopping never waits on
the driver: calls still stuck in it are named in the log and left behind.
"""

from __future__ import annotations

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler
from healthd.component import ComponentBase
from healthd.node import Node

log = structlog.get_logger("device")

FIRST_SAMPLE_SECONDS = 30.0


class DeviceComponent(ComponentBase):
    name = "device"

    def __init__(self, device: GuardedBackend, sampler: Sampler) -> None:
        self.device = device
        self.sampler = sampler

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


def build(node: Node) -> DeviceComponent:
    return DeviceComponent(node.device, node.sampler)
