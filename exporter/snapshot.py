"""The immutable result of one sampling cycle, shared read-only by collectors, probes and the API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.backends.call_counters import CallCounters
from exporter.backends.types import (
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    GpuProcess,
    MigInstance,
    PcieThroughput,
    SystemInfo,
)
from exporter.bus import SubscriberStats


def _empty_text() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """What is known of one card. ``sample`` keeps the last good reading; ``fresh`` says whether it is current."""

    index: int
    info: DeviceInfo | None  # None until the card answered its inventory call once
    sample: DeviceSample | None
    processes: tuple[GpuProcess, ...]
    mig_instances: tuple[MigInstance, ...]
    sampled_at: float | None  # unix time of the last complete, successful cycle
    fresh: bool  # the last cycle completed without error or timeout
    error: str | None = None  # why it is not fresh, one line
    error_code: str | None = None  # timeout, gpu_lost, reset_required, error, ...
    profiling: DeviceProfiling | None = None  # GPM over the last interval; None when the call failed
    pcie_throughput: PcieThroughput | None = None  # the slow-cadence fallback, only where GPM has no PCIe rates
    # parts of a fresh sample that could not be read (e.g. "processes" -> "no_permission: ..."); they are unknown,
    # not empty: collectors leave them out instead of reporting zero
    partial_errors: Mapping[str, str] = field(default_factory=_empty_text)

    @property
    def processes_known(self) -> bool:
        return "processes" not in self.partial_errors

    @property
    def mig_instances_known(self) -> bool:
        return "mig_instances" not in self.partial_errors

    @property
    def uuid(self) -> str:
        return self.info.uuid if self.info else ""


@dataclass(frozen=True, slots=True)
class StuckCall:
    """A driver call past its deadline that had not returned when the Snapshot was taken."""

    lane: str  # a card index, "node" or "events"
    call: str
    seconds: float  # how long it had been in the driver


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int
    taken_at: float  # unix time the cycle finished
    interval_seconds: float
    cycle_seconds: float  # wall time the cycle took
    backend_name: str
    backend_up: bool  # the driver library is initialised
    backend_error: str | None
    system: SystemInfo | None
    gpus: tuple[GpuSnapshot, ...]
    counters: CallCounters
    stuck_calls: tuple[StuckCall, ...] = ()
    subscribers: tuple[SubscriberStats, ...] = ()  # as of the previous Snapshot's hand-off

    def gpu(self, index: int) -> GpuSnapshot | None:
        return next((g for g in self.gpus if g.index == index), None)
