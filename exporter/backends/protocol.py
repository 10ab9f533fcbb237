"""The Backend protocol: exactly what the daemon needs from a GPU driver, nothing more.

Calls are synchronous and may block (a real driver can hang); the device-access layer puts a deadline on every one.
Each per-device method is independent so that one stuck card never stalls calls for another.

Fault injection is an optional capability, not a kind of backend: ``Backend.injector`` is a :class:`FaultInjector`
where the backend can inject faults (the simulated node) and None on real GPUs, so no caller needs to know which
backend it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

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


class UnknownGpuError(ValueError):
    """A fault was aimed at a card the node does not have."""

    def __init__(self, gpu: int, count: int) -> None:
        super().__init__(f"gpu {gpu} does not exist (this node has {count})")
        self.gpu = gpu
        self.count = count


class FaultInjector(Protocol):
    """Faults injected into a running node at run time, as the real faults would show through the driver.

    Not a driver call: injecting changes the backend's state without waiting on any card (a hang fault blocks the
    card's later calls, not the injection), so it may be called from any thread and from the event loop."""

    @property
    def kinds(self) -> Mapping[str, frozenset[str]]:
        """Every fault kind, with the parameter names it accepts."""
        ...

    def inject(self, kind: str, gpu: int = 0, params: Mapping[str, str] | None = None) -> str:
        """Apply one fault to card ``gpu``; returns a one-line description. Raises :class:`UnknownGpuError` for a card
        the node does not have, ValueError for an unknown kind or a parameter the kind does not accept or allow."""
        ...

    def clear(self, gpu: int | None = None) -> str:
        """Take back the lasting faults (lost card, hangs, links down, ...) on one card or, with None, on all; returns
        a one-line description. Raises :class:`UnknownGpuError` for a card the node does not have."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Read side plus the few MIG writes the partition service needs."""

    name: str

    @property
    def injector(self) -> FaultInjector | None:
        """Run-time fault injection where this backend offers it (the simulated node); None on real GPUs."""
        ...

    def open(self) -> None:
        """Initialise the driver library. Raises DriverUnavailableError or VersionMismatchError."""

    def close(self) -> None:
        """Release the library; safe to call twice."""

    def system_info(self) -> SystemInfo: ...

    def device_count(self) -> int: ...

    def device_info(self, index: int) -> DeviceInfo:
        """Identity and static limits of one card (read once, at start)."""
        ...

    def sample(self, index: int) -> DeviceSample:
        """All per-cycle readings of one card, using the cheap calls (counters, not 20 ms sampling windows)."""
        ...

    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unknown:
        """Compute processes with their used memory and, where the driver keeps it, SM utilization.

        ``UNKNOWN`` when the driver will not list them although the card answers: with MIG on, NVML lists the parent
        card's processes only to a privileged caller (NVML_ERROR_NO_PERMISSION otherwise). The rest of the card's
        sample stays valid; an empty tuple means no process runs."""
        ...

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        """MIG devices on the card, each with its own memory use; empty when MIG is off."""
        ...

    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        """Profiling (GPM) metrics of the card and of each given MIG instance over the interval since the previous
        call, plus encoder/decoder utilization. The backend keeps the previous GPM sample of each card and GPU
        instance: call it once per sampling cycle, from the card's own lane (the first call has no interval yet)."""
        ...

    def pcie_throughput(self, index: int) -> PcieThroughput:
        """PCIe TX/RX throughput from the driver's 20 ms sampling window (two ~20 ms calls): the fallback for cards
        whose GPM gives no PCIe rates. Slow: call it on a slower cadence than ``sample``."""
        ...

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        """The card's GPU-instance profile table with legal placements; empty when not MIG capable."""
        ...

    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        """Create a GPU instance at a placement and one compute instance spanning it."""
        ...

    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        """Destroy the compute instances and the GPU instance. Raises InUseError while processes run."""
        ...

    def nvlink_peers(self, index: int) -> tuple[str, ...] | Unsupported:
        """What each active NVLink of the card connects to: the peer's PCI bus id, or ``"nvswitch"`` for a link to
        an NVSwitch (one entry per active link). UNSUPPORTED when the card has no NVLink. Read rarely (topology)."""
        ...

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        """Wait for the next XID or ECC event on any card; None on timeout."""
        ...
