"""The Backend protocol: exactly what the daemon needs from a GPU driver, nothing more.

Calls are synchronous and may block (a real driver can hang); the sampler puts a deadline on every one. Each
per-device method is independent so that one stuck card never stalls calls for another.
"""

from __future__ import annotations

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


@runtime_checkable
class Backend(Protocol):
    """Read side plus the few MIG writes the partition service needs."""

    name: str

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
