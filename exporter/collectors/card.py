"""Per-card metrics: identity, utilization, memory, thermals, power, clocks, PCIe, ECC, row remapping, NVLink.

PCIe throughput is a rate, never a byte counter: NVML's PCIe byte counters are 32 bits wide and wrap several times
a second at Gen5 x16, so no read interval can follow them.

Only cards whose last cycle succeeded get value series; a stuck or lost card keeps its ``xpu_gpu_info`` and shows
``xpu_gpu_up 0`` instead of repeating old numbers. Unsupported readings are omitted, never exported as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.backends.recovery import recovery_code
from exporter.backends.types import (
    UNSUPPORTED,
    ClockEventReason,
    ComputeMode,
    DeviceSample,
    LinkState,
    ProfilingMetric,
    Unsupported,
)
from exporter.collectors.base import GPU_LABELS, gpu_label_values
from exporter.snapshot import GpuSnapshot, Snapshot

MHZ = 1_000_000.0


@dataclass(frozen=True, slots=True)
class _Gauge:
    name: str
    help: str
    read: str  # DeviceSample attribute
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class _Counter:
    name: str  # without _total
    help: str
    read: str
    scale: float = 1.0


_GAUGES = (
    _Gauge(
        "xpu_gpu_utilization_ratio",
        "Share of time one or more kernels ran (nvmlDeviceGetUtilizationRates.gpu).",
        "gpu_utilization_ratio",
    ),
    _Gauge(
        "xpu_gpu_memory_utilization_ratio",
        "Share of time device memory was read or written (nvmlDeviceGetUtilizationRates.memory).",
        "memory_utilization_ratio",
    ),
    _Gauge("xpu_gpu_memory_used_bytes", "Device memory in use (nvmlDeviceGetMemoryInfo_v2).", "memory_used_bytes"),
    _Gauge("xpu_gpu_memory_free_bytes", "Device memory free (nvmlDeviceGetMemoryInfo_v2).", "memory_free_bytes"),
    _Gauge(
        "xpu_gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.", "memory_reserved_bytes"
    ),
    _Gauge("xpu_gpu_temperature_celsius", "GPU die temperature.", "temperature_gpu_celsius"),
    _Gauge(
        "xpu_gpu_memory_temperature_celsius", "HBM temperature (NVML_FI_DEV_MEMORY_TEMP).", "temperature_memory_celsius"
    ),
    _Gauge("xpu_gpu_power_watts", "Board power draw (nvmlDeviceGetPowerUsage).", "power_draw_watts"),
    _Gauge("xpu_gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts"),
    _Gauge("xpu_gpu_sm_clock_hertz", "Current SM clock.", "sm_clock_mhz", MHZ),
    _Gauge("xpu_gpu_memory_clock_hertz", "Current memory clock.", "memory_clock_mhz", MHZ),
    _Gauge("xpu_gpu_performance_state", "Performance state, 0 (P0, fastest) to 15.", "performance_state"),
    _Gauge("xpu_gpu_pcie_link_generation", "Current PCIe link generation.", "pcie_generation"),
    _Gauge("xpu_gpu_pcie_link_width", "Current PCIe link width (lanes).", "pcie_width"),
)

_COUNTERS = (
    _Counter(
        "xpu_gpu_energy_joules",
        "Energy used since the driver loaded (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).",
        "energy_joules",
    ),
    _Counter("xpu_gpu_pcie_replays", "PCIe replay events (NVML_FI_DEV_PCIE_REPLAY_COUNTER).", "pcie_replay_count"),
)


def _num(value: object) -> float | None:
    if value is UNSUPPORTED or value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None


class CardCollector:
    name = "card"

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        return list(self._families(snapshot))

    def _families(self, snapshot: Snapshot) -> Iterator[Metric]:
        labels = list(GPU_LABELS)
        info = InfoMetricFamily(
            "xpu_gpu",
            "Identity of each GPU; join on uuid.",
            labels=[*labels, "model", "pci_bus_id", "serial", "vbios_version", "compute_capability", "driver_version"],
        )
        up = GaugeMetricFamily(
            "xpu_gpu_up", "Whether the card's last sampling cycle succeeded (1) or not (0).", labels=labels
        )
        last = GaugeMetricFamily(
            "xpu_gpu_last_sample_timestamp_seconds", "Unix time of the card's last successful sample.", labels=labels
        )
        total = GaugeMetricFamily("xpu_gpu_memory_total_bytes", "Device memory size.", labels=labels)
        static = {
            "sm": GaugeMetricFamily("xpu_gpu_sm_clock_max_hertz", "Highest SM clock.", labels=labels),
            "mem": GaugeMetricFamily("xpu_gpu_memory_clock_max_hertz", "Highest memory clock.", labels=labels),
            "gen": GaugeMetricFamily(
                "xpu_gpu_pcie_link_generation_max", "Highest PCIe generation of the link.", labels=labels
            ),
            "width": GaugeMetricFamily("xpu_gpu_pcie_link_width_max", "Widest PCIe link (lanes).", labels=labels),
        }
        driver = snapshot.system.driver_version if snapshot.system else ""
        for gpu in snapshot.gpus:
            values = gpu_label_values(gpu)
            up.add_metric(values, 1.0 if gpu.fresh else 0.0)
            if gpu.sampled_at is not None:
                last.add_metric(values, gpu.sampled_at)
            if gpu.info is None:
                continue
            i = gpu.info
            cc = "" if i.compute_capability is UNSUPPORTED else "{}.{}".format(*i.compute_capability)
            info.add_metric(
                values,
                {
                    "model": i.name,
                    "pci_bus_id": i.pci_bus_id,
                    "serial": "" if i.serial is UNSUPPORTED else i.serial,
                    "vbios_version": "" if i.vbios_version is UNSUPPORTED else i.vbios_version,
                    "compute_capability": cc,
                    "driver_version": driver,
                },
            )
            total.add_metric(values, float(i.memory_total_bytes))
            for key, value, scale in (
                ("sm", i.sm_clock_max_mhz, MHZ),
                ("mem", i.memory_clock_max_mhz, MHZ),
                ("gen", i.pcie_generation_max, 1.0),
                ("width", i.pcie_width_max, 1.0),
            ):
                v = _num(value)
                if v is not None:
                    static[key].add_metric(values, v * scale)
        yield from (info, up, last, total, *static.values())
        fresh = [g for g in snapshot.gpus if g.fresh and g.sample is not None and g.info is not None]
        yield from self._sample_families(fresh)
        yield _recovery_action(fresh, driver)

    def _sample_families(self, gpus: list[GpuSnapshot]) -> Iterator[Metric]:
        labels = list(GPU_LABELS)
        for spec in _GAUGES:
            fam = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            for gpu in gpus:
                v = _num(getattr(gpu.sample, spec.read))
                if v is not None:
                    fam.add_metric(gpu_label_values(gpu), v * spec.scale)
            yield fam
        for cspec in _COUNTERS:
            cfam = CounterMetricFamily(cspec.name, cspec.help, labels=labels)
            for gpu in gpus:
                v = _num(getattr(gpu.sample, cspec.read))
                if v is not None:
                    cfam.add_metric(gpu_label_values(gpu), v * cspec.scale)
            yield cfam
        yield from _pcie(gpus)
        yield from _modes(gpus)
        yield from _ecc(gpus)
        yield from _nvlink(gpus)
        procs = GaugeMetricFamily("xpu_gpu_processes", "Compute processes with a context on the card.", labels=labels)
        for gpu in gpus:
            if gpu.processes_known:  # unknown (e.g. refused on a MIG card without privileges) is absent, not 0
                procs.add_metric(gpu_label_values(gpu), float(len(gpu.processes)))
        yield procs


RECOVERY_ACTION_HELP = (
    "Recovery the driver asks for (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, decoded by driver branch): 0 none, "
    "1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset, 5 recover the IMEX domain, 6 bus reset, "
    "7 system reboot, -1 a value the driver's branch does not define."
)


def _recovery_action(gpus: list[GpuSnapshot], driver: str) -> Metric:
    """The branch-independent code: the raw field means different things on different drivers (5 is a bus reset on
    R580 and the IMEX domain from R595 on), so a dashboard or alert reads one meaning per value."""
    fam = GaugeMetricFamily("xpu_gpu_recovery_action", RECOVERY_ACTION_HELP, labels=list(GPU_LABELS))
    for gpu in gpus:
        raw = _sample(gpu).recovery_action
        if not isinstance(raw, Unsupported):
            fam.add_metric(gpu_label_values(gpu), float(recovery_code(raw, driver or None)))
    return fam


def _sample(gpu: GpuSnapshot) -> DeviceSample:
    assert gpu.sample is not None
    return gpu.sample


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


def _pcie(gpus: list[GpuSnapshot]) -> Iterator[Metric]:
    labels = list(GPU_LABELS)
    tx = GaugeMetricFamily(
        "xpu_gpu_pcie_transmit_bytes_per_second",
        "Bytes per second the card sent over PCIe: GPM's average over the last sampling interval, or on cards "
        "without it nvmlDeviceGetPcieThroughput's 20 ms window (see xpu_gpu_pcie_throughput_source).",
        labels=labels,
    )
    rx = GaugeMetricFamily(
        "xpu_gpu_pcie_receive_bytes_per_second",
        "Bytes per second the card received over PCIe (as xpu_gpu_pcie_transmit_bytes_per_second).",
        labels=labels,
    )
    source = GaugeMetricFamily(
        "xpu_gpu_pcie_throughput_source",
        "1 for where the PCIe rates come from: gpm (interval average) or sampling_window (20 ms, slower cadence).",
        labels=[*labels, "source"],
    )
    for gpu in gpus:
        values = gpu_label_values(gpu)
        sent, received, origin = pcie_rates(gpu)
        for family, value in ((tx, sent), (rx, received)):
            if value is not None:
                family.add_metric(values, value)
        if origin:
            source.add_metric([*values, origin], 1.0)
    return iter((tx, rx, source))


def _modes(gpus: list[GpuSnapshot]) -> Iterator[Metric]:
    labels = list(GPU_LABELS)
    reasons = GaugeMetricFamily(
        "xpu_gpu_clock_event_active",
        "Whether a clocks-event reason (throttle or idle) is active (nvmlDeviceGetCurrentClocksEventReasons).",
        labels=[*labels, "reason"],
    )
    compute = GaugeMetricFamily(
        "xpu_gpu_compute_mode", "The card's compute mode: 1 for the current one.", labels=[*labels, "mode"]
    )
    persistence = GaugeMetricFamily(
        "xpu_gpu_persistence_mode_enabled", "Persistence mode on (1) or off (0).", labels=labels
    )
    mig_current = GaugeMetricFamily("xpu_gpu_mig_mode_enabled", "MIG mode currently on (1) or off (0).", labels=labels)
    mig_pending = GaugeMetricFamily(
        "xpu_gpu_mig_mode_pending_enabled",
        "MIG mode after the next reset; differs from current while a change is pending.",
        labels=labels,
    )
    for gpu in gpus:
        s, values = _sample(gpu), gpu_label_values(gpu)
        if not isinstance(s.clock_event_reasons, Unsupported):
            for reason in ClockEventReason:
                reasons.add_metric([*values, reason.label], 1.0 if s.clock_event_reasons & reason else 0.0)
        if not isinstance(s.compute_mode, Unsupported):
            for mode in ComputeMode:
                compute.add_metric([*values, mode.name.lower()], 1.0 if s.compute_mode is mode else 0.0)
        for fam, value in (
            (persistence, s.persistence_mode),
            (mig_current, s.mig_mode_current),
            (mig_pending, s.mig_mode_pending),
        ):
            v = _num(value)
            if v is not None:
                fam.add_metric(values, v)
    return iter((reasons, compute, persistence, mig_current, mig_pending))


def _ecc(gpus: list[GpuSnapshot]) -> Iterator[Metric]:
    labels = list(GPU_LABELS)
    enabled = GaugeMetricFamily("xpu_gpu_ecc_enabled", "ECC mode currently on (1) or off (0).", labels=labels)
    pending = GaugeMetricFamily("xpu_gpu_ecc_pending_enabled", "ECC mode after the next reset.", labels=labels)
    volatile = CounterMetricFamily(
        "xpu_gpu_ecc_volatile_errors",
        "ECC errors since the driver loaded, by kind (corrected, uncorrected).",
        labels=[*labels, "kind"],
    )
    aggregate = CounterMetricFamily(
        "xpu_gpu_ecc_aggregate_errors",
        "ECC errors over the card's lifetime (persisted in the InfoROM), by kind.",
        labels=[*labels, "kind"],
    )
    remapped = CounterMetricFamily(
        "xpu_gpu_remapped_rows", "Memory rows remapped, by the error kind that caused it.", labels=[*labels, "kind"]
    )
    remap_pending = GaugeMetricFamily(
        "xpu_gpu_row_remap_pending", "A row remap waits for a GPU reset (1) or not (0).", labels=labels
    )
    remap_failure = GaugeMetricFamily(
        "xpu_gpu_row_remap_failure", "A row remap failed: the card needs replacing (1).", labels=labels
    )
    for gpu in gpus:
        s, values = _sample(gpu), gpu_label_values(gpu)
        e = s.ecc
        for fam, value in ((enabled, e.enabled_current), (pending, e.enabled_pending)):
            v = _num(value)
            if v is not None:
                fam.add_metric(values, v)
        for counter, corrected, uncorrected in (
            (volatile, e.corrected_volatile, e.uncorrected_volatile),
            (aggregate, e.corrected_aggregate, e.uncorrected_aggregate),
        ):
            for kind, count in (("corrected", corrected), ("uncorrected", uncorrected)):
                v = _num(count)
                if v is not None:
                    counter.add_metric([*values, kind], v)
        if not isinstance(s.remapped_rows, Unsupported):
            r = s.remapped_rows
            remapped.add_metric([*values, "correctable"], float(r.correctable))
            remapped.add_metric([*values, "uncorrectable"], float(r.uncorrectable))
            remap_pending.add_metric(values, 1.0 if r.pending else 0.0)
            remap_failure.add_metric(values, 1.0 if r.failure else 0.0)
    return iter((enabled, pending, volatile, aggregate, remapped, remap_pending, remap_failure))


def _nvlink(gpus: list[GpuSnapshot]) -> Iterator[Metric]:
    labels = [*GPU_LABELS, "link"]
    up = GaugeMetricFamily(
        "xpu_gpu_nvlink_up", "NVLink link state: 1 up, 0 down. Absent on cards without NVLink.", labels=labels
    )
    counters = (
        (
            CounterMetricFamily("xpu_gpu_nvlink_crc_errors", "NVLink CRC errors (flit and data).", labels=labels),
            "crc_errors",
        ),
        (CounterMetricFamily("xpu_gpu_nvlink_replay_errors", "NVLink replay errors.", labels=labels), "replay_errors"),
        (
            CounterMetricFamily("xpu_gpu_nvlink_recovery_errors", "NVLink recovery errors.", labels=labels),
            "recovery_errors",
        ),
        (CounterMetricFamily("xpu_gpu_nvlink_transmit_bytes", "Bytes sent over the link.", labels=labels), "tx_bytes"),
        (
            CounterMetricFamily("xpu_gpu_nvlink_receive_bytes", "Bytes received over the link.", labels=labels),
            "rx_bytes",
        ),
    )
    for gpu in gpus:
        s = _sample(gpu)
        if isinstance(s.nvlinks, Unsupported):
            continue
        for link in s.nvlinks:
            values = [*gpu_label_values(gpu), str(link.link)]
            up.add_metric(values, 1.0 if link.state is LinkState.UP else 0.0)
            for fam, attr in counters:
                v = _num(getattr(link, attr))
                if v is not None:
                    fam.add_metric(values, v)
    return iter((up, *(fam for fam, _ in counters)))
