"""Plain values the backends return.

Every reading that a card may not support is typed ``X | Unsupported``: NVML's NotSupported becomes the
``UNSUPPORTED`` marker, never an exception and never a fake zero, so collectors can omit the series and probes can
report "unsupported" instead of a fault.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Unsupported(enum.Enum):
    """The single marker for a value the device does not support."""

    UNSUPPORTED = "unsupported"

    def __repr__(self) -> str:
        return "UNSUPPORTED"


UNSUPPORTED = Unsupported.UNSUPPORTED


class Unknown(enum.Enum):
    """The marker for a reading the device has but the driver would not give this time (e.g. the parent card's
    process list with MIG on, which NVML gives only to privileged callers). Unlike an empty result it says nothing
    about what is there; unlike an error it leaves the rest of the sample valid."""

    UNKNOWN = "unknown"

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown.UNKNOWN


class ComputeMode(enum.IntEnum):
    DEFAULT = 0
    EXCLUSIVE_THREAD = 1  # deprecated by NVIDIA, still reported by old drivers
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class ClockEventReason(enum.IntFlag):
    """Why the clocks are where they are: the bits of ``nvmlDeviceGetCurrentClocksEventReasons`` (nvml.h
    ``nvmlClocksEventReason*``, called clocks *throttle* reasons before driver 535). ``DeviceSample`` keeps the raw
    bits, so bits a newer driver adds pass through unnamed. A member's :attr:`label` is the ``reason`` label value
    of ``xpu_gpu_clock_event_active``, which dashboards and alert rules match on: never rename one."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100

    # The slowdowns: the card runs slower than its work asks because something is wrong with it or around it.
    # nvml.h: HW slowdown cuts the core clocks by half or more (too hot, an external power brake, or power drawn so
    # fast that fast-trigger protection steps in); HW thermal and HW power brake name the first two causes; SW
    # thermal slowdown means the GPU or its memory is above its maximum operating temperature (cooling). All four
    # want a person to look. Not slowdowns: SW power cap (how a busy card stays within its power limit, normal at
    # full load), idle, sync boost, and application or display clock settings (configuration).
    SLOWDOWN = HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN

    @property
    def label(self) -> str:
        """``"hw_thermal_slowdown"``: the exported label value of a single reason."""
        return self.name.lower() if self.name else str(int(self))

    @classmethod
    def active(cls, bits: int) -> tuple[ClockEventReason, ...]:
        """The named reasons set in ``bits``, lowest bit first (iterating the class gives each single reason)."""
        return tuple(reason for reason in cls if bits & reason)

    @classmethod
    def slowdowns(cls, bits: int) -> tuple[ClockEventReason, ...]:
        """The slowdown reasons (:attr:`SLOWDOWN`) set in ``bits``, lowest bit first."""
        return cls.active(bits & cls.SLOWDOWN)


class EventKind(enum.StrEnum):
    XID = "xid"
    ECC_SINGLE_BIT = "ecc_sbe"
    ECC_DOUBLE_BIT = "ecc_dbe"


class LinkState(enum.StrEnum):
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class SystemInfo:
    driver_version: str
    nvml_version: str
    cuda_driver_version: int | Unsupported
    backend: str  # "nvml" or "simulated:<scenario>"


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile as the card reports it (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    profile_id: int
    name: str  # e.g. "1g.18gb"
    slice_count: int  # compute slices
    memory_mib: int
    sm_count: int
    instance_count: int  # the most instances of this profile the card can hold
    placements: tuple[tuple[int, int], ...]  # legal (start, size) in memory slices
    media: MediaEngines | None = None  # None when the backend does not know them


@dataclass(frozen=True, slots=True)
class MediaEngines:
    """The engines one instance of a GPU-instance profile gets (decoderCount, encoderCount, jpegCount, ofaCount,
    copyEngineCount of ``nvmlGpuInstanceProfileInfo_t``)."""

    decoders: int
    encoders: int
    jpeg_decoders: int
    optical_flow: int
    copy_engines: int


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance with its (single) compute instance, as a MIG device."""

    parent_index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    uuid: str  # "MIG-..."
    sm_count: int
    memory_total_bytes: int
    memory_used_bytes: int | Unsupported


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Identity and static properties, read once at start (cheap to keep, costly to re-read)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str | Unsupported
    minor_number: int | Unsupported
    memory_total_bytes: int
    sm_clock_max_mhz: int | Unsupported
    memory_clock_max_mhz: int | Unsupported
    pcie_generation_max: int | Unsupported
    pcie_width_max: int | Unsupported
    power_limit_default_mw: int | Unsupported
    nvlink_count: int  # links the card has (0 when NVLink is unsupported)
    mig_capable: bool
    compute_capability: tuple[int, int] | Unsupported
    vbios_version: str | Unsupported


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    link: int
    state: LinkState
    crc_errors: int | Unsupported  # flit + data CRC errors
    replay_errors: int | Unsupported
    recovery_errors: int | Unsupported
    tx_bytes: int | Unsupported
    rx_bytes: int | Unsupported


@dataclass(frozen=True, slots=True)
class EccCounts:
    enabled_current: bool | Unsupported
    enabled_pending: bool | Unsupported
    corrected_volatile: int | Unsupported
    uncorrected_volatile: int | Unsupported
    corrected_aggregate: int | Unsupported
    uncorrected_aggregate: int | Unsupported


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One cycle's readings of one card. Counters are raw device counters (monotonic until reset)."""

    gpu_utilization_ratio: float | Unsupported
    memory_utilization_ratio: float | Unsupported
    memory_used_bytes: int
    memory_free_bytes: int
    memory_reserved_bytes: int | Unsupported
    temperature_gpu_celsius: float | Unsupported
    temperature_memory_celsius: float | Unsupported
    power_draw_watts: float | Unsupported
    power_limit_watts: float | Unsupported
    energy_joules: float | Unsupported  # counter since driver load
    sm_clock_mhz: int | Unsupported
    memory_clock_mhz: int | Unsupported
    clock_event_reasons: int | Unsupported  # NVML clocks-event-reason bits, named by ClockEventReason
    performance_state: int | Unsupported  # 0 (P0) .. 15
    pcie_generation: int | Unsupported
    pcie_width: int | Unsupported
    pcie_replay_count: int | Unsupported  # counter
    ecc: EccCounts
    remapped_rows: RemappedRows | Unsupported
    recovery_action: int | Unsupported  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 reset, 2 reboot, 3 drain
    nvlinks: tuple[NvLinkSample, ...] | Unsupported
    compute_mode: ComputeMode | Unsupported
    persistence_mode: bool | Unsupported
    mig_mode_current: bool | Unsupported
    mig_mode_pending: bool | Unsupported


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process with a context on the card (compute processes, as NVML lists them)."""

    pid: int
    used_memory_bytes: int | Unsupported
    sm_utilization_ratio: float | Unsupported
    gpu_instance_id: int | Unsupported  # MIG GPU instance, UNSUPPORTED when MIG is off
    name: str = ""  # filled from /proc by attribution when empty


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """A critical event from the driver (NVML event set): an XID or an ECC error.

    On a MIG card NVML names the instance the event happened in (``nvmlEventData_t.gpuInstanceId`` and
    ``computeInstanceId``); both are None for an event of the whole card (MIG off, or a card-level fault)."""

    kind: EventKind
    gpu_index: int
    uuid: str
    xid: int  # the XID number; for ECC events NVML reports 48 (DBE) or 0 (SBE)
    timestamp: float  # unix seconds when the backend saw it
    data: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


# --- profiling (GPM) and throughput readings -------------------------------------------------------------------


class ProfilingMetric(enum.StrEnum):
    """What NVML's GPM API measures between two samples: activity ratios (0-1) and byte rates (bytes per second).

    ``TENSOR_ACTIVE`` is the share of cycles with any tensor pipe busy; the per-kind tensor ratios overlap it and
    do not add up to it.
    """

    GRAPHICS_ACTIVE = "graphics_active"
    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    TENSOR_HMMA_ACTIVE = "tensor_hmma_active"
    TENSOR_IMMA_ACTIVE = "tensor_imma_active"
    TENSOR_DFMA_ACTIVE = "tensor_dfma_active"
    TENSOR_DMMA_ACTIVE = "tensor_dmma_active"
    DRAM_ACTIVE = "dram_active"
    FP64_ACTIVE = "fp64_active"
    FP32_ACTIVE = "fp32_active"
    FP16_ACTIVE = "fp16_active"
    INTEGER_ACTIVE = "integer_active"
    PCIE_TX_BYTES_PER_SECOND = "pcie_tx_bytes_per_second"
    PCIE_RX_BYTES_PER_SECOND = "pcie_rx_bytes_per_second"
    NVLINK_TX_BYTES_PER_SECOND = "nvlink_tx_bytes_per_second"
    NVLINK_RX_BYTES_PER_SECOND = "nvlink_rx_bytes_per_second"

    @property
    def is_rate(self) -> bool:
        return self.value.endswith("_bytes_per_second")


class MediaEngine(enum.StrEnum):
    """Fixed-function engines GPM reports per engine instance."""

    NVDEC = "nvdec"
    NVJPG = "nvjpg"
    NVOFA = "nvofa"
    NVENC = "nvenc"


def _no_metrics() -> Mapping[ProfilingMetric, float]:
    return MappingProxyType({})


def _no_engines() -> Mapping[tuple[MediaEngine, int], float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ProfilingSample:
    """GPM readings of one card or one MIG GPU instance, averaged over ``interval_seconds`` (two samples).

    Only what the device answered is present: a metric it does not support is absent, never 0.
    """

    interval_seconds: float
    metrics: Mapping[ProfilingMetric, float] = field(default_factory=_no_metrics)
    engines: Mapping[tuple[MediaEngine, int], float] = field(default_factory=_no_engines)  # busy ratio per engine


@dataclass(frozen=True, slots=True)
class DeviceProfiling:
    """One cycle's profiling readings of a card: GPM for the card and each MIG GPU instance, and the encoder and
    decoder utilization NVML keeps itself.

    ``card`` is None where the card has no GPM (before Hopper, or the driver refuses it) and on the first call,
    when no interval is complete yet; ``mig`` holds only GPU instances with a complete interval.
    """

    gpm_supported: bool
    card: ProfilingSample | None
    mig: Mapping[int, ProfilingSample]  # by gpu_instance_id
    encoder_utilization_ratio: float | Unsupported
    decoder_utilization_ratio: float | Unsupported

    @property
    def pcie_sample(self) -> ProfilingSample | None:
        """The card's GPM sample where it gives PCIe rates; None where the slow PCIe fallback must serve instead."""
        card = self.card
        return card if card is not None and ProfilingMetric.PCIE_TX_BYTES_PER_SECOND in card.metrics else None


@dataclass(frozen=True, slots=True)
class PcieThroughput:
    """PCIe traffic over the driver's own short sampling window (``nvmlDeviceGetPcieThroughput``): the fallback
    where GPM gives no PCIe rates. A snapshot of a 20 ms window, not an average over the sampling interval."""

    tx_bytes_per_second: float | Unsupported
    rx_bytes_per_second: float | Unsupported
    measured_at: float  # unix time of the reading
