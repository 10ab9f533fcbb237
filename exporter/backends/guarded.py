"""The device-access layer's Backend facades: the only way anything in the daemon reaches the GPU driver.

Every method runs the backend's call on its card's lane (``lanes.py``) and obeys its deadline. Sync callers (the
sampler, the topology collector, the XID watcher) use :class:`GuardedBackend`, which implements the Backend
protocol with those rules. Async callers (the partition manager) use its ``aio`` view, :class:`AsyncDevice`, whose
methods are awaitables that never block the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from exporter.backends.lanes import EVENTS, NODE, DeviceAccess, Pending, Scope
from exporter.backends.protocol import Backend, FaultInjector
from exporter.backends.types import (
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    GpuProcess,
    MigInstance,
    MigProfile,
    PcieThroughput,
    SystemInfo,
    Unknown,
    Unsupported,
)

T = TypeVar("T")


class GuardedBackend:
    """The Backend protocol over lanes: every method runs on its card's lane and obeys its deadline."""

    def __init__(self, access: DeviceAccess) -> None:
        self.access = access
        self.name = access.backend.name
        self.aio = AsyncDevice(access)

    @property
    def injector(self) -> FaultInjector | None:
        """The backend's fault injector: not a driver call, so it does not go through a lane."""
        return self.access.backend.injector

    @property
    def raw(self) -> Backend:
        """The backend itself, for what is not a driver call (fault injection in simulation, identity)."""
        return self.access.backend

    def _run(self, scope: Scope, call: str, fn: Callable[[], T], deadline: float) -> T:
        return self.access.submit(scope, call, fn, deadline).result()

    def open(self) -> None:
        b, d = self.access.backend, self.access.deadlines
        self._run(NODE, "open", b.open, d.open_deadline_seconds)

    def close(self) -> None:
        b, d = self.access.backend, self.access.deadlines
        self._run(NODE, "close", b.close, d.open_deadline_seconds)

    def system_info(self) -> SystemInfo:
        b, d = self.access.backend, self.access.deadlines
        return self._run(NODE, "system_info", b.system_info, d.call_deadline_seconds)

    def device_count(self) -> int:
        b, d = self.access.backend, self.access.deadlines
        return self._run(NODE, "device_count", b.device_count, d.call_deadline_seconds)

    def device_info(self, index: int) -> DeviceInfo:
        return self._run(index, "device_info", _bind(self.access.backend.device_info, index), self._read)

    def sample(self, index: int) -> DeviceSample:
        return self._run(index, "sample", _bind(self.access.backend.sample, index), self._read)

    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unknown:
        return self._run(index, "processes", _bind(self.access.backend.processes, index), self._read)

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        return self._run(index, "mig_instances", _bind(self.access.backend.mig_instances, index), self._read)

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        return self._run(index, "mig_profiles", _bind(self.access.backend.mig_profiles, index), self._read)

    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        fn = self.access.backend.create_mig_instance
        return self._run(index, "create_mig_instance", lambda: fn(index, profile_id, placement_start), self._change)

    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        fn = self.access.backend.destroy_mig_instance
        self._run(index, "destroy_mig_instance", lambda: fn(index, gpu_instance_id), self._change)

    def nvlink_peers(self, index: int) -> tuple[str, ...] | Unsupported:
        return self._run(index, "nvlink_peers", _bind(self.access.backend.nvlink_peers, index), self._read)

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        """The next driver event; one that a stuck wait returns after its deadline is the next call's answer."""
        fn = self.access.backend.wait_event
        deadline = timeout_s + self._read
        return self.access.submit(EVENTS, "wait_event", lambda: fn(timeout_s), deadline, keep_late=True).result()

    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        fn = self.access.backend.profiling
        return self._run(index, "profiling", lambda: fn(index, mig_instances), self._read)

    def pcie_throughput(self, index: int) -> PcieThroughput:
        return self._run(index, "pcie_throughput", _bind(self.access.backend.pcie_throughput, index), self._read)

    def submit(self, index: int, call: str, *args: object) -> Pending[Any]:
        """Start one per-card read without waiting (the sampler fans a cycle out over every card this way)."""
        fn = getattr(self.access.backend, call)
        return self.access.submit(index, call, lambda: fn(index, *args), self._read)

    @property
    def _read(self) -> float:
        return self.access.deadlines.call_deadline_seconds

    @property
    def _change(self) -> float:
        return self.access.deadlines.change_deadline_seconds


class AsyncDevice:
    """Awaitable driver calls for the event loop: the call runs on its card's lane, the loop never blocks."""

    def __init__(self, access: DeviceAccess) -> None:
        self._access = access

    def _run(self, scope: Scope, call: str, fn: Callable[[], T], deadline: float) -> Pending[T]:
        return self._access.submit(scope, call, fn, deadline)

    async def device_count(self) -> int:
        b, d = self._access.backend, self._access.deadlines
        return await self._run(NODE, "device_count", b.device_count, d.call_deadline_seconds).wait()

    async def device_info(self, index: int) -> DeviceInfo:
        fn = _bind(self._access.backend.device_info, index)
        return await self._run(index, "device_info", fn, self._access.deadlines.call_deadline_seconds).wait()

    async def sample(self, index: int) -> DeviceSample:
        fn = _bind(self._access.backend.sample, index)
        return await self._run(index, "sample", fn, self._access.deadlines.call_deadline_seconds).wait()

    async def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        fn = _bind(self._access.backend.mig_instances, index)
        return await self._run(index, "mig_instances", fn, self._access.deadlines.call_deadline_seconds).wait()

    async def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        fn = _bind(self._access.backend.mig_profiles, index)
        return await self._run(index, "mig_profiles", fn, self._access.deadlines.call_deadline_seconds).wait()

    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> Pending[MigInstance]:
        """Started at once; await ``.wait()``. The future completes even after a timeout (late creates are adopted)."""
        fn = self._access.backend.create_mig_instance
        return self._run(
            index,
            "create_mig_instance",
            lambda: fn(index, profile_id, placement_start),
            self._access.deadlines.change_deadline_seconds,
        )

    async def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        fn = self._access.backend.destroy_mig_instance
        await self._run(
            index,
            "destroy_mig_instance",
            lambda: fn(index, gpu_instance_id),
            self._access.deadlines.change_deadline_seconds,
        ).wait()


def _bind(fn: Callable[[int], T], index: int) -> Callable[[], T]:
    return lambda: fn(index)


__all__ = ["AsyncDevice", "GuardedBackend"]
