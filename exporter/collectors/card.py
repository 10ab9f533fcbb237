"""Per-card metrics: identity, utilization, memory, thermals, power, clocks, PCIe, ECC, row remapping, NVLink.

PCIe throughput is a rate, never a byte counter: NVML's PCIe byte counters are 32 bits wide and wrap several times
a second at Gen5 x16, so no read interval can follow them.

Only cards whose last cycle succeeded get value series; a stuck or lost card keeps its ``xpu_gpu_info`` and shows
``xpu_gpu_up 0`` instead of repeating old numbers. Unsupported readings are omitted, never exported as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.backends.recovery import recovery_code
from exporter.backends.types import (
    UNSUPPORTED,
    ClockEventReason,
    ComputeMode,
    DeviceInfo,
    DeviceSample,
    LinkState,
    NvLinkSample,
    ProfilingMetric,
    Unsupported,
)
from exporter.collectors.base import GPU_LABELS, gpu_labels
from exporter.collectors.series import COUNTER, INFO, Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import GpuSnapshot, Snapshot

MHZ = 1_000_000.0
LABELS = GPU_LABELS


@dataclass(frozen=True, slots=True)
class _Reading:
    family: Family
    read: str  # DeviceSample attribute
    scale: float = 1.0


def _gauge(name: str, help: str, read: str, scale: float = 1.0) -> _Reading:
    return _Reading(Family(name, help, labels=LABELS), read, scale)


def _counter(name: str, help: str, read: str) -> _Reading:
    return _Reading(Family(name, help, COUNTER, LABELS), read)


INFO_FAMILY = Family(
    "xpu_gpu",
    "Identity of each GPU; join on uuid.",
    INFO,
    (*LABELS, "model", "pci_bus_id", "serial", "vbios_version", "compute_capability", "driver_version"),
)
UP = Family("xpu_gpu_up", "Whether the card's last sampling cycle succeeded (1) or not (0).", labels=LABELS)
LAST = Family("xpu_gpu_last_sample_timestamp_seconds", "Unix time of the card's last successful sample.", labels=LABELS)
TOTAL = Family("xpu_gpu_memory_total_bytes", "Device memory size.", labels=LABELS)
STATIC = (  # (family, DeviceInfo attribute, scale)
    (Family("xpu_gpu_sm_clock_max_hertz", "Highest SM clock.", labels=LABELS), "sm_clock_max_mhz", MHZ),
    (Family("xpu_gpu_memory_clock_max_hertz", "Highest memory clock.", labels=LABELS), "memory_clock_max_mhz", MHZ),
    (
        Family("xpu_gpu_pcie_link_generation_max", "Highest PCIe generation of the link.", labels=LABELS),
        "pcie_generation_max",
        1.0,
    ),
    (Family("xpu_gpu_pcie_link_width_max", "Widest PCIe link (lanes).", labels=LABELS), "pcie_width_max", 1.0),
)

_READINGS = (
    _gauge(
        "xpu_gpu_utilization_ratio",
        "Share of time one or more kernels ran (nvmlDeviceGetUtilizationRates.gpu).",
        "gpu_utilization_ratio",
    ),
    _gauge(
        "xpu_gpu_memory_utilization_ratio",
        "Share of time device memory was read or written (nvmlDeviceGetUtilizationRates.memory).",
        "memory_utilization_ratio",
    ),
    _gauge("xpu_gpu_memory_used_bytes", "Device memory in use (nvmlDeviceGetMemoryInfo_v2).", "memory_used_bytes"),
    _gauge("xpu_gpu_memory_free_bytes", "Device memory free (nvmlDeviceGetMemoryInfo_v2).", "memory_free_bytes"),
    _gauge(
        "xpu_gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.", "memory_reserved_bytes"
    ),
    _gauge("xpu_gpu_temperature_celsius", "GPU die temperature.", "temperature_gpu_celsius"),
    _gauge(
        "xpu_gpu_memory_temperature_celsius", "HBM temperature (NVML_FI_DEV_MEMORY_TEMP).", "temperature_memory_celsius"
    ),
    _gauge("xpu_gpu_power_watts", "Board power draw (nvmlDeviceGetPowerUsage).", "power_draw_watts"),
    _gauge("xpu_gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts"),
    _gauge("xpu_gpu_sm_clock_hertz", "Current SM clock.", "sm_clock_mhz", MHZ),
    _gauge("xpu_gpu_memory_clock_hertz", "Current memory clock.", "memory_clock_mhz", MHZ),
    _gauge("xpu_gpu_performance_state", "Performance state, 0 (P0, fastest) to 15.", "performance_state"),
    _gauge("xpu_gpu_pcie_link_generation", "Current PCIe link generation.", "pcie_generation"),
    _gauge("xpu_gpu_pcie_link_width", "Current PCIe link width (lanes).", "pcie_width"),
    _counter(
        "xpu_gpu_energy_joules",
        "Energy used since the driver loaded (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).",
        "energy_joules",
    ),
    _counter("xpu_gpu_pcie_replays", "PCIe replay events (NVML_FI_DEV_PCIE_REPLAY_COUNTER).", "pcie_replay_count"),
)
PCIE_TX = Family(
    "xpu_gpu_pcie_transmit_bytes_per_second",
    "Bytes per second the card sent over PCIe: GPM's average over the last sampling interval, or on cards "
    "without it nvmlDeviceGetPcieThroughput's 20 ms window (see xpu_gpu_pcie_throughput_source).",
    labels=LABELS,
)
PCIE_RX = Family(
    "xpu_gpu_pcie_receive_bytes_per_second",
    "Bytes per second the card received over PCIe (as xpu_gpu_pcie_transmit_bytes_per_second).",
    labels=LABELS,
)
PCIE_SOURCE = Family(
    "xpu_gpu_pcie_throughput_source",
    "1 for where the PCIe rates come from: gpm (interval average) or sampling_window (20 ms, slower cadence).",
    labels=(*LABELS, "source"),
)
REASONS = Family(
    "xpu_gpu_clock_event_active",
    "Whether a clocks-event reason (throttle or idle) is active (nvmlDeviceGetCurrentClocksEventReasons).",
    labels=(*LABELS, "reason"),
)
COMPUTE = Family("xpu_gpu_compute_mode", "The card's compute mode: 1 for the current one.", labels=(*LABELS, "mode"))
PERSISTENCE = Family("xpu_gpu_persistence_mode_enabled", "Persistence mode on (1) or off (0).", labels=LABELS)
MIG_CURRENT = Family("xpu_gpu_mig_mode_enabled", "MIG mode currently on (1) or off (0).", labels=LABELS)
MIG_PENDING = Family(
    "xpu_gpu_mig_mode_pending_enabled",
    "MIG mode after the next reset; differs from current while a change is pending.",
    labels=LABELS,
)
ECC_ENABLED = Family("xpu_gpu_ecc_enabled", "ECC mode currently on (1) or off (0).", labels=LABELS)
ECC_PENDING = Family("xpu_gpu_ecc_pending_enabled", "ECC mode after the next reset.", labels=LABELS)
ECC_VOLATILE = Family(
    "xpu_gpu_ecc_volatile_errors",
    "ECC errors since the driver loaded, by kind (corrected, uncorrected).",
    COUNTER,
    (*LABELS, "kind"),
)
ECC_AGGREGATE = Family(
    "xpu_gpu_ecc_aggregate_errors",
    "ECC errors over the card's lifetime (persisted in the InfoROM), by kind.",
    COUNTER,
    (*LABELS, "kind"),
)
REMAPPED = Family(
    "xpu_gpu_remapped_rows", "Memory rows remapped, by the error kind that caused it.", COUNTER, (*LABELS, "kind")
)
REMAP_PENDING = Family("xpu_gpu_row_remap_pending", "A row remap waits for a GPU reset (1) or not (0).", labels=LABELS)
REMAP_FAILURE = Family("xpu_gpu_row_remap_failure", "A row remap failed: the card needs replacing (1).", labels=LABELS)
LINK_LABELS = (*LABELS, "link")
NVLINK_UP = Family(
    "xpu_gpu_nvlink_up", "NVLink link state: 1 up, 0 down. Absent on cards without NVLink.", labels=LINK_LABELS
)
NVLINK_COUNTERS = (  # (family, NvLinkSample attribute)
    (Family("xpu_gpu_nvlink_crc_errors", "NVLink CRC errors (flit and data).", COUNTER, LINK_LABELS), "crc_errors"),
    (Family("xpu_gpu_nvlink_replay_errors", "NVLink replay errors.", COUNTER, LINK_LABELS), "replay_errors"),
    (Family("xpu_gpu_nvlink_recovery_errors", "NVLink recovery errors.", COUNTER, LINK_LABELS), "recovery_errors"),
    (Family("xpu_gpu_nvlink_transmit_bytes", "Bytes sent over the link.", COUNTER, LINK_LABELS), "tx_bytes"),
    (Family("xpu_gpu_nvlink_receive_bytes", "Bytes received over the link.", COUNTER, LINK_LABELS), "rx_bytes"),
)
_NVLINK_ERRORS = NVLINK_COUNTERS[:3]
NVLINK_TX, NVLINK_RX = NVLINK_COUNTERS[3][0], NVLINK_COUNTERS[4][0]  # tx_bytes, rx_bytes
PROCESSES = Family("xpu_gpu_processes", "Compute processes with a context on the card.", labels=LABELS)
RECOVERY_ACTION_HELP = (
    "Recovery the driver asks for (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, decoded by driver branch): 0 none, "
    "1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset, 5 recover the IMEX domain, 6 bus reset, "
    "7 system reboot, -1 a value the driver's branch does not define."
)
RECOVERY_ACTION = Family("xpu_gpu_recovery_action", RECOVERY_ACTION_HELP, labels=LABELS)

FAMILIES = (
    INFO_FAMILY, UP, LAST, TOTAL, *(f for f, _, _ in STATIC), *(r.family for r in _READINGS),
    PCIE_TX, PCIE_RX, PCIE_SOURCE, REASONS, COMPUTE, PERSISTENCE, MIG_CURRENT, MIG_PENDING,
    ECC_ENABLED, ECC_PENDING, ECC_VOLATILE, ECC_AGGREGATE, REMAPPED, REMAP_PENDING, REMAP_FAILURE,
    NVLINK_UP, *(f for f, _ in NVLINK_COUNTERS), PROCESSES, RECOVERY_ACTION,
)  # fmt: skip


def _num(value: object) -> float | None:
    if value is UNSUPPORTED or value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None


class CardCollector(SeriesCollector):
    """Each card is written as blocks, each kept while what it is made from is unchanged: its state (up, last
    sample), its identity (DeviceInfo), its readings, modes, ECC, NVLink and recovery action."""

    name = "card"

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(*FAMILIES)
        driver = snapshot.system.driver_version if snapshot.system else ""
        for gpu in snapshot.gpus:
            labels = gpu_labels(gpu)
            if (rows := out.block(("state", gpu.index), (labels, gpu.fresh, gpu.sampled_at))) is not None:
                rows.add(UP, labels, 1.0 if gpu.fresh else 0.0)
                if gpu.sampled_at is not None:
                    rows.add(LAST, labels, gpu.sampled_at)
            if gpu.info is None:
                continue
            if (rows := out.block(("info", gpu.index), (gpu.index, gpu.info, driver))) is not None:
                _identity(rows, labels, gpu.info, driver)
            if gpu.fresh and gpu.sample is not None:
                _readings(out, gpu, labels, gpu.sample, driver)


def _identity(rows: Rows, labels: tuple[str, str], i: DeviceInfo, driver: str) -> None:
    cc = "" if i.compute_capability is UNSUPPORTED else "{}.{}".format(*i.compute_capability)
    serial = "" if i.serial is UNSUPPORTED else i.serial
    vbios = "" if i.vbios_version is UNSUPPORTED else i.vbios_version
    rows.add(INFO_FAMILY, (*labels, i.name, i.pci_bus_id, serial, vbios, cc, driver), 1.0)
    rows.add(TOTAL, labels, float(i.memory_total_bytes))
    for family, attr, scale in STATIC:
        v = _num(getattr(i, attr))
        if v is not None:
            rows.add(family, labels, v * scale)


def _readings(out: Exposer, gpu: GpuSnapshot, labels: tuple[str, str], s: DeviceSample, driver: str) -> None:
    key, rates = gpu.index, pcie_rates(gpu)
    processes = float(len(gpu.processes)) if gpu.processes_known else None  # unknown is absent, not 0
    if (rows := out.block(("readings", key), (labels, s, rates, processes))) is not None:
        for reading in _READINGS:
            v = _num(getattr(s, reading.read))
            if v is not None:
                rows.add(reading.family, labels, v * reading.scale)
        sent, received, origin = rates
        for family, value in ((PCIE_TX, sent), (PCIE_RX, received)):
            if value is not None:
                rows.add(family, labels, value)
        if origin:
            rows.add(PCIE_SOURCE, (*labels, origin), 1.0)
        if processes is not None:
            rows.add(PROCESSES, labels, processes)
    modes = (s.clock_event_reasons, s.compute_mode, s.persistence_mode, s.mig_mode_current, s.mig_mode_pending)
    if (rows := out.block(("modes", key), (labels, modes))) is not None:
        _modes(rows, labels, s)
    if (rows := out.block(("ecc", key), (labels, s.ecc, s.remapped_rows))) is not None:
        _ecc(rows, labels, s)
    if not isinstance(s.nvlinks, Unsupported):
        _nvlinks(out, key, labels, s.nvlinks)
    recovery = s.recovery_action
    if (rows := out.block(("recovery", key), (labels, recovery, driver))) is not None and not isinstance(
        recovery, Unsupported
    ):
        # the branch-independent code: the raw field means different things on different drivers (5 is a bus
        # reset on R580 and the IMEX domain from R595 on), so a dashboard or alert reads one meaning per value
        rows.add(RECOVERY_ACTION, labels, float(recovery_code(recovery, driver or None)))


def _nvlinks(out: Exposer, key: int, labels: tuple[str, str], links: tuple[NvLinkSample, ...]) -> None:
    """Two blocks: link state and error counters, which seldom change, apart from the byte counters, which change
    every sample on a link in use (each family is in one block only, so its lines keep their order)."""
    # the fields _NVLINK_ERRORS reads, named (this is built for every card at every render)
    errors = tuple([(n.link, n.state, n.crc_errors, n.replay_errors, n.recovery_errors) for n in links])
    if (rows := out.block(("nvlink", key), (labels, errors))) is not None:
        for link in links:
            values = (*labels, str(link.link))
            rows.add(NVLINK_UP, values, 1.0 if link.state is LinkState.UP else 0.0)
            _link_counters(rows, values, link, _NVLINK_ERRORS)
    if (rows := out.block(("nvlink bytes", key), (labels, links))) is not None:
        _link_bytes(rows, labels, links)


def _link_counters(
    rows: Rows, values: tuple[str, ...], link: NvLinkSample, counters: tuple[tuple[Family, str], ...]
) -> None:
    for family, attr in counters:
        v = _num(getattr(link, attr))
        if v is not None:
            rows.add(family, values, v)


def _link_bytes(rows: Rows, labels: tuple[str, str], links: tuple[NvLinkSample, ...]) -> None:
    """The byte counters of NVLINK_COUNTERS, without _link_counters' getattr and _num: written for every busy card
    at every render. They are ints or UNSUPPORTED (and _num makes float(v) of an int)."""
    for link in links:
        values = (*labels, str(link.link))
        if (sent := link.tx_bytes) is not UNSUPPORTED:
            rows.add(NVLINK_TX, values, float(sent))
        if (received := link.rx_bytes) is not UNSUPPORTED:
            rows.add(NVLINK_RX, values, float(received))


def pcie_rates(gpu: GpuSnapshot) -> tuple[float | None, float | None, str]:
    """(transmit, receive) bytes per second and where they come from: GPM's average over the last interval, else
    the driver's 20 ms window read on a slower cadence; ``(None, None, "")`` when neither answered."""
    gpm = gpu.profiling.pcie_sample if gpu.profiling is not None else None
    if gpm is not None:
        tx = gpm.metrics.get(ProfilingMetric.PCIE_TX_BYTES_PER_SECOND)
        return tx, gpm.metrics.get(ProfilingMetric.PCIE_RX_BYTES_PER_SECOND), "gpm"
    window = gpu.pcie_throughput
    if window is None:
        return None, None, ""
    return _num(window.tx_bytes_per_second), _num(window.rx_bytes_per_second), "sampling_window"


def _modes(rows: Rows, labels: tuple[str, str], s: DeviceSample) -> None:
    if not isinstance(s.clock_event_reasons, Unsupported):
        for reason in ClockEventReason:
            rows.add(REASONS, (*labels, reason.label), 1.0 if s.clock_event_reasons & reason else 0.0)
    if not isinstance(s.compute_mode, Unsupported):
        for mode in ComputeMode:
            rows.add(COMPUTE, (*labels, mode.name.lower()), 1.0 if s.compute_mode is mode else 0.0)
    for family, value in (
        (PERSISTENCE, s.persistence_mode),
        (MIG_CURRENT, s.mig_mode_current),
        (MIG_PENDING, s.mig_mode_pending),
    ):
        v = _num(value)
        if v is not None:
            rows.add(family, labels, v)


def _ecc(rows: Rows, labels: tuple[str, str], s: DeviceSample) -> None:
    e = s.ecc
    for family, value in ((ECC_ENABLED, e.enabled_current), (ECC_PENDING, e.enabled_pending)):
        v = _num(value)
        if v is not None:
            rows.add(family, labels, v)
    for counter, corrected, uncorrected in (
        (ECC_VOLATILE, e.corrected_volatile, e.uncorrected_volatile),
        (ECC_AGGREGATE, e.corrected_aggregate, e.uncorrected_aggregate),
    ):
        for kind, count in (("corrected", corrected), ("uncorrected", uncorrected)):
            v = _num(count)
            if v is not None:
                rows.add(counter, (*labels, kind), v)
    if not isinstance(s.remapped_rows, Unsupported):
        r = s.remapped_rows
        rows.add(REMAPPED, (*labels, "correctable"), float(r.correctable))
        rows.add(REMAPPED, (*labels, "uncorrectable"), float(r.uncorrectable))
        rows.add(REMAP_PENDING, labels, 1.0 if r.pending else 0.0)
        rows.add(REMAP_FAILURE, labels, 1.0 if r.failure else 0.0)
