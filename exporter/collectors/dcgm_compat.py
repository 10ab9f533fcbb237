"""dcgm-exporter compatible series (opt-in), so dashboards and alerts written for dcgm-exporter keep working.

Names, units and labels follow dcgm-exporter's default counters before its 4.9.0 renames (``etc/default-counters.csv``
of the 4.8 line): clocks in MHz, memory in MiB, utilization in percent, energy in millijoules, profiling ratios 0-1
and byte rates per second, with ``gpu``, ``UUID``, ``device``, ``modelName``, the host-name label, ``pci_bus_id``
and ``DCGM_FI_DRIVER_VERSION`` on every series. They are built from the same Snapshot as the ``xpu_*`` metrics, so
both agree. dcgm-exporter's counters have no ``_total`` suffix; to keep the names exact they are exposed untyped
(``rate()`` works the same).

Pod labels follow dcgm-exporter's Kubernetes mapping with shared GPUs (``--kubernetes-virtual-gpus``): a per-GPU
series is repeated once per container kubelet allocated the device to, with ``pod``, ``namespace`` and
``container``; a device no container holds keeps one series without them. See docs/dcgm-compat.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter.attribution.attributor import Attribution
from exporter.backends.types import UNSUPPORTED, DeviceSample, ProfilingMetric, ProfilingSample, Unsupported
from exporter.collectors.card import pcie_rates
from exporter.snapshot import GpuSnapshot, Snapshot

MIB = float(1 << 20)
MB = 1e6  # DCGM's NVLink throughput unit (decimal megabytes per second)
HOSTNAME_LABELS = ("hostname", "Hostname")  # dcgm-exporter 4.6.0-4.8.3 and later / releases before it
BASE_LABELS = ("gpu", "UUID", "device", "modelName", "{hostname}", "pci_bus_id", "DCGM_FI_DRIVER_VERSION")
POD_LABELS = ("pod", "namespace", "container")
M = ProfilingMetric

Labels = dict[str, str]
PodKey = tuple[int, str]  # (gpu index, gpu instance id or "" for the whole card)
Pod = tuple[str, str, str]  # (pod, namespace, container)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    help: str
    read: Callable[[DeviceSample], float | None]
    counter: bool = False


@dataclass(frozen=True, slots=True)
class _Prof:
    """A DCGM profiling field read from a GPM reading (the card's, or a MIG instance's)."""

    name: str
    help: str
    metric: ProfilingMetric


def _opt(value: object, scale: float = 1.0) -> float | None:
    if value is UNSUPPORTED or value is None or isinstance(value, Unsupported):
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value) * scale
    return None


def _remap(s: DeviceSample, attr: str) -> float | None:
    rows = s.remapped_rows
    return None if isinstance(rows, Unsupported) else _opt(getattr(rows, attr))


def _nvlink_sum(s: DeviceSample, attr: str) -> float | None:
    if isinstance(s.nvlinks, Unsupported) or not s.nvlinks:
        return None
    values = [getattr(link, attr) for link in s.nvlinks]
    known = [v for v in values if not isinstance(v, Unsupported)]
    return float(sum(known)) if known else None


FIELDS: tuple[_Field, ...] = (
    _Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: _opt(s.sm_clock_mhz)),
    _Field("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda s: _opt(s.memory_clock_mhz)),
    _Field("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda s: _opt(s.temperature_memory_celsius)),
    _Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: _opt(s.temperature_gpu_celsius)),
    _Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: _opt(s.power_draw_watts)),
    _Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        lambda s: _opt(s.energy_joules, 1000.0),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", lambda s: _opt(s.pcie_replay_count), True
    ),
    _Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: _opt(s.gpu_utilization_ratio, 100.0)),
    _Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda s: _opt(s.memory_utilization_ratio, 100.0)
    ),
    _Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda s: s.memory_free_bytes / MIB),
    _Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.memory_used_bytes / MIB),
    _Field(
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        lambda s: _opt(s.memory_reserved_bytes, 1 / MIB),
    ),
    _Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        lambda s: _remap(s, "uncorrectable"),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        lambda s: _remap(s, "correctable"),
        counter=True,
    ),
    _Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", lambda s: _remap(s, "failure")),
    # shipped commented out in default-counters.csv; cheap here and used by common alert rules
    _Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        lambda s: _opt(s.ecc.corrected_volatile),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        lambda s: _opt(s.ecc.uncorrected_volatile),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        lambda s: _opt(s.ecc.corrected_aggregate),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        lambda s: _opt(s.ecc.uncorrected_aggregate),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        lambda s: _nvlink_sum(s, "replay_errors"),
        counter=True,
    ),
    _Field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        lambda s: _nvlink_sum(s, "recovery_errors"),
        counter=True,
    ),
)

# Activity fields exist per card and per MIG GPU instance; the byte rates per card only.
PROF_ACTIVITY: tuple[_Prof, ...] = (
    _Prof("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", M.GRAPHICS_ACTIVE),
    _Prof("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned.", M.SM_ACTIVE),
    _Prof("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the SM's maximum.", M.SM_OCCUPANCY),
    _Prof("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles any tensor pipe is active.", M.TENSOR_ACTIVE),
    _Prof("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is busy.", M.DRAM_ACTIVE),
    _Prof("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active.", M.FP64_ACTIVE),
    _Prof("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active.", M.FP32_ACTIVE),
    _Prof("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active.", M.FP16_ACTIVE),
)
PROF_NVLINK: tuple[_Prof, ...] = (
    _Prof("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes sent per second.", M.NVLINK_TX_BYTES_PER_SECOND),
    _Prof("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second.", M.NVLINK_RX_BYTES_PER_SECOND),
)
PCIE = (
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes sent per second (GPM, else the driver's 20 ms window).", "tx"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received per second (GPM, else the driver's 20 ms window).", "rx"),
)


def _family(name: str, help_text: str, counter: bool = False) -> Metric:
    # counters keep dcgm-exporter's exact name (no _total), so they are exposed untyped
    return Metric(name, help_text, "unknown" if counter else "gauge")


def _pods(attribution: Attribution | None) -> Mapping[PodKey, list[Pod]]:
    """Containers kubelet allocated each card (gpu instance "") or MIG instance to, one entry per container."""
    out: dict[PodKey, list[Pod]] = {}
    for a in attribution.allocations if attribution is not None else ():
        holders = out.setdefault((a.gpu, a.gpu_instance_id), [])
        if (a.pod, a.namespace, a.container) not in holders:
            holders.append((a.pod, a.namespace, a.container))
    return {key: sorted(holders) for key, holders in out.items()}


class DcgmCompatCollector:
    """dcgm-exporter's default series. ``last_xid`` (optional) gives the last XID per GPU index for
    DCGM_FI_DEV_XID_ERRORS; the exporter itself does not see XIDs (the daemon's fault pipeline does).
    ``attribution`` (optional) gives kubelet's device allocations for the pod labels."""

    name = "dcgm_compat"

    def __init__(
        self,
        hostname: str,
        last_xid: Callable[[], Mapping[int, int]] | None = None,
        *,
        hostname_label: str = "hostname",
        attribution: Callable[[], Attribution | None] | None = None,
    ) -> None:
        if hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname_label must be one of {', '.join(HOSTNAME_LABELS)}, got {hostname_label!r}")
        self._hostname = hostname
        self._label_names = tuple(hostname_label if n == "{hostname}" else n for n in BASE_LABELS)
        self._last_xid = last_xid
        self._attribution = attribution

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        return list(self._families(snapshot))

    # --- labels ----------------------------------------------------------------------------------------------

    def _labels(self, snapshot: Snapshot, gpu: GpuSnapshot) -> Labels:
        info = gpu.info
        assert info is not None
        minor = info.minor_number
        device = f"nvidia{minor}" if isinstance(minor, int) else f"nvidia{gpu.index}"
        driver = snapshot.system.driver_version if snapshot.system else ""
        values = (str(gpu.index), info.uuid, device, info.name, self._hostname, info.pci_bus_id, driver)
        return dict(zip(self._label_names, values, strict=True))

    @staticmethod
    def _with_pods(base: Labels, holders: list[Pod]) -> list[Labels]:
        if not holders:
            return [base]
        return [{**base, **dict(zip(POD_LABELS, pod, strict=True))} for pod in holders]

    # --- families ---------------------------------------------------------------------------------------------

    def _families(self, snapshot: Snapshot) -> Iterator[Metric]:
        gpus = [g for g in snapshot.gpus if g.info is not None and g.fresh and g.sample is not None]
        pods = _pods(self._attribution() if self._attribution is not None else None)
        base = {g.index: self._labels(snapshot, g) for g in gpus}
        card = {g.index: self._with_pods(base[g.index], pods.get((g.index, ""), [])) for g in gpus}
        mig = {
            (g.index, m.gpu_instance_id): self._with_pods(
                {**base[g.index], "GPU_I_PROFILE": m.profile_name, "GPU_I_ID": str(m.gpu_instance_id)},
                pods.get((g.index, str(m.gpu_instance_id)), []),
            )
            for g in gpus
            for m in g.mig_instances
        }
        for field in FIELDS:
            family = _family(field.name, field.help, field.counter)
            for gpu in gpus:
                assert gpu.sample is not None
                _add(family, card[gpu.index], field.read(gpu.sample))
            if field.name in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"):
                self._add_mig_memory(family, gpus, mig, used=field.name == "DCGM_FI_DEV_FB_USED")
            yield family
        yield from self._codec(gpus, card)
        yield from self._profiling(gpus, card, mig)
        if self._last_xid is not None:
            xid = _family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
            last = self._last_xid()
            for gpu in snapshot.gpus:
                if gpu.info is not None:
                    labels = card.get(gpu.index) or [self._labels(snapshot, gpu)]
                    _add(xid, labels, float(last.get(gpu.index, 0)))
            yield xid

    @staticmethod
    def _add_mig_memory(
        family: Metric, gpus: list[GpuSnapshot], mig: Mapping[tuple[int, int], list[Labels]], *, used: bool
    ) -> None:
        """Per MIG device memory, labelled like dcgm-exporter's GPU-instance entities (GPU_I_PROFILE, GPU_I_ID)."""
        for gpu in gpus:
            for m in gpu.mig_instances:
                if isinstance(m.memory_used_bytes, Unsupported):
                    continue
                value = m.memory_used_bytes if used else m.memory_total_bytes - m.memory_used_bytes
                _add(family, mig[(gpu.index, m.gpu_instance_id)], value / MIB)

    @staticmethod
    def _codec(gpus: list[GpuSnapshot], card: Mapping[int, list[Labels]]) -> Iterator[Metric]:
        enc = _family("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).")
        dec = _family("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).")
        for gpu in gpus:
            if gpu.profiling is not None:
                _add(enc, card[gpu.index], _opt(gpu.profiling.encoder_utilization_ratio, 100.0))
                _add(dec, card[gpu.index], _opt(gpu.profiling.decoder_utilization_ratio, 100.0))
        return iter((enc, dec))

    @staticmethod
    def _profiling(
        gpus: list[GpuSnapshot], card: Mapping[int, list[Labels]], mig: Mapping[tuple[int, int], list[Labels]]
    ) -> Iterator[Metric]:
        for prof in (*PROF_ACTIVITY, *PROF_NVLINK):
            family = _family(prof.name, prof.help)
            for gpu in gpus:
                whole = gpu.profiling.card if gpu.profiling is not None else None
                if whole is not None:
                    _add(family, card[gpu.index], whole.metrics.get(prof.metric))
                if prof in PROF_ACTIVITY and gpu.profiling is not None:
                    for gi, reading in sorted(gpu.profiling.mig.items()):
                        if (gpu.index, gi) in mig:
                            _add(family, mig[(gpu.index, gi)], reading.metrics.get(prof.metric))
            yield family
        for name, text, direction in PCIE:
            family = _family(name, text)
            for gpu in gpus:
                sent, received, _source = pcie_rates(gpu)
                _add(family, card[gpu.index], sent if direction == "tx" else received)
            yield family
        total = _family(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "NVLink throughput of all links, both directions (in MB/s).",
            counter=True,
        )
        for gpu in gpus:
            whole = gpu.profiling.card if gpu.profiling is not None else None
            _add(total, card[gpu.index], _nvlink_total(whole))
        yield total


def _nvlink_total(reading: ProfilingSample | None) -> float | None:
    if reading is None:
        return None
    tx, rx = reading.metrics.get(M.NVLINK_TX_BYTES_PER_SECOND), reading.metrics.get(M.NVLINK_RX_BYTES_PER_SECOND)
    return None if tx is None or rx is None else (tx + rx) / MB


def _add(family: Metric, label_sets: list[Labels], value: float | None) -> None:
    if value is None:
        return
    for labels in label_sets:
        family.add_sample(family.name, labels, value)
