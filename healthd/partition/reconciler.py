"""The periodic reconcile loop: give kubelet-device leases to their pods, reclaim partitions whose owner is gone,
finish deletes, restart dead MPS daemons."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from healthd.partition.manager import PartitionManager
from healthd.partition.owners import DeviceHolders
from healthd.partition.podbind import bind_to_pods

log = structlog.get_logger("partition.reconciler")


class Reconciler:
    def __init__(
        self, manager: PartitionManager, interval_seconds: float, device_holders: DeviceHolders | None = None
    ) -> None:
        self._manager = manager
        self._interval = interval_seconds
        self._device_holders = device_holders  # kubelet's devices: kubelet-device leases become pod owners
        self._task: asyncio.Task[None] | None = None
        self.passes = 0

    async def run_once(self) -> list[str]:
        if self._device_holders is not None:
            await bind_to_pods(self._manager, self._device_holders)
        reclaimed = await self._manager.reconcile()
        self.passes += 1
        if reclaimed:
            log.info("reclaimed partitions", partitions=reclaimed)
        return reclaimed

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.run_once()
            except Exception:  # one bad pass must not end reconciliation
                log.exception("reconcile pass failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="partition-reconciler")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
