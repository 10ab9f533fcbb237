"""dcgm-exporter compatible series (opt-in), so dashboards and alerts written for dcgm-exporter keep working.

Names, units and labels follow dcgm-exporter's default counters in the release line chosen with ``version``
(``[exporter] dcgm_compat_version``): "4.10", the default, for 4.9.0 and later (DCGM's standard names, base units,
``DCGM_FI_SYSTEM_DRIVER_VERSION``), or "4.8" for the names before 4.9.0's renames (MHz, MiB, percent, millijoules,
``DCGM_FI_DRIVER_VERSION``). dcgm_fields.py holds both tables and their sources. Every series carries ``gpu``,
``UUID``, ``device``, ``modelName``, the host-name label, ``pci_bus_id`` and the driver version. They are built from
the same Snapshot as the ``xpu_*`` metrics, so both agree. dcgm-exporter's counters keep their exact names (no
``_total`` appended), so they are exposed untyped (``rate()`` works the same).

Pod labels follow dcgm-exporter's Kubernetes mapping with shared GPUs (``--kubernetes-virtual-gpus``): a per-GPU
series is repeated once per container kubelet allocated the device to, with ``pod``, ``namespace`` and
``container``; a device no container holds keeps one series without them. See docs/dcgm-compat.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import Metric

from exporter.attribution.attributor import Attribution
from exporter.backends.types import UNSUPPORTED, DeviceSample, ProfilingMetric, ProfilingSample, Unsupported
from exporter.collectors.card import pcie_rates
from exporter.collectors.dcgm_fields import DEFAULT_VERSION, Name, naming
from exporter.snapshot import GpuSnapshot, Snapshot

HOSTNAME_LABELS = ("hostname", "Hostname")  # dcgm-exporter 4.6.0-4.8.3 and later / releases before it
POD_LABELS = ("pod", "namespace", "container")
M = ProfilingMetric

Labels = dict[str, str]
PodKey = tuple[int, str]  # (gpu index, gpu instance id or "" for the whole card)
Pod = tuple[str, str, str]  # (pod, namespace, container)


def _opt(value: object) -> float | None:
    if value is UNSUPPORTED or value is None or isinstance(value, Unsupported):
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
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


def _mhz(value: object) -> float | None:
    mhz = _opt(value)
    return None if mhz is None else mhz * 1e6


# Per-card fields from the device sample (the capacity from the card's identity), each in its base unit (Hz, J, ratio,
# bytes), in exposition order.
CARD_FIELDS: tuple[tuple[str, Callable[[DeviceSample, GpuSnapshot], float | None]], ...] = (
    ("sm_clock", lambda s, _g: _mhz(s.sm_clock_mhz)),
    ("memory_clock", lambda s, _g: _mhz(s.memory_clock_mhz)),
    ("memory_temp", lambda s, _g: _opt(s.temperature_memory_celsius)),
    ("gpu_temp", lambda s, _g: _opt(s.temperature_gpu_celsius)),
    ("power", lambda s, _g: _opt(s.power_draw_watts)),
    ("energy", lambda s, _g: _opt(s.energy_joules)),
    ("pcie_replays", lambda s, _g: _opt(s.pcie_replay_count)),
    ("gpu_util", lambda s, _g: _opt(s.gpu_utilization_ratio)),
    ("memory_util", lambda s, _g: _opt(s.memory_utilization_ratio)),
    ("fb_capacity", lambda _s, g: float(g.info.memory_total_bytes) if g.info is not None else None),
    ("fb_free", lambda s, _g: float(s.memory_free_bytes)),
    ("fb_used", lambda s, _g: float(s.memory_used_bytes)),
    ("fb_reserved", lambda s, _g: _opt(s.memory_reserved_bytes)),
    ("remap_uncorrectable", lambda s, _g: _remap(s, "uncorrectable")),
    ("remap_correctable", lambda s, _g: _remap(s, "correctable")),
    ("remap_failure", lambda s, _g: _remap(s, "failure")),
    ("ecc_sbe_volatile", lambda s, _g: _opt(s.ecc.corrected_volatile)),
    ("ecc_dbe_volatile", lambda s, _g: _opt(s.ecc.uncorrected_volatile)),
    ("ecc_sbe_aggregate", lambda s, _g: _opt(s.ecc.corrected_aggregate)),
    ("ecc_dbe_aggregate", lambda s, _g: _opt(s.ecc.uncorrected_aggregate)),
    ("nvlink_replays", lambda s, _g: _nvlink_sum(s, "replay_errors")),
    ("nvlink_recoveries", lambda s, _g: _nvlink_sum(s, "recovery_errors")),
)
# GPM fields: activity per card and per MIG GPU instance, NVLink byte rates per card only.
PROF_ACTIVITY: tuple[tuple[str, ProfilingMetric], ...] = (
    ("prof_graphics", M.GRAPHICS_ACTIVE),
    ("prof_sm_active", M.SM_ACTIVE),
    ("prof_sm_occupancy", M.SM_OCCUPANCY),
    ("prof_tensor", M.TENSOR_ACTIVE),
    ("prof_dram", M.DRAM_ACTIVE),
    ("prof_fp64", M.FP64_ACTIVE),
    ("prof_fp32", M.FP32_ACTIVE),
    ("prof_fp16", M.FP16_ACTIVE),
)
PROF_NVLINK: tuple[tuple[str, ProfilingMetric], ...] = (
    ("prof_nvlink_tx", M.NVLINK_TX_BYTES_PER_SECOND),
    ("prof_nvlink_rx", M.NVLINK_RX_BYTES_PER_SECOND),
)


def _family(spec: Name) -> Metric:
    # counters keep dcgm-exporter's exact name (no _total), so they are exposed untyped
    return Metric(spec.name, spec.help, "unknown" if spec.counter else "gauge")


def _pods(attribution: Attribution | None) -> Mapping[PodKey, list[Pod]]:
    """Containers kubelet allocated each card (gpu instance "") or MIG instance to, one entry per container."""
    out: dict[PodKey, list[Pod]] = {}
    for a in attribution.allocations if attribution is not None else ():
        holders = out.setdefault((a.gpu, a.gpu_instance_id), [])
        if (a.pod, a.namespace, a.container) not in holders:
            holders.append((a.pod, a.namespace, a.container))
    return {key: sorted(holders) for key, holders in out.items()}


class DcgmCompatCollector:
    """dcgm-exporter's default series of release line ``version`` ("4.10" or "4.8"). ``last_xid`` (optional) gives
    the last XID per GPU index for the XID field; the exporter itself does not see XIDs (the daemon's fault pipeline
    does). ``attribution`` (optional) gives kubelet's device allocations for the pod labels."""

    name = "dcgm_compat"

    def __init__(
        self,
        hostname: str,
        last_xid: Callable[[], Mapping[int, int]] | None = None,
        *,
        hostname_label: str = "hostname",
        attribution: Callable[[], Attribution | None] | None = None,
        version: str = DEFAULT_VERSION,
    ) -> None:
        if hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname_label must be one of {', '.join(HOSTNAME_LABELS)}, got {hostname_label!r}")
        self._naming = naming(version)
        self._hostname = hostname
        self._label_names = (
            "gpu",
            "UUID",
            "device",
            "modelName",
            hostname_label,
            "pci_bus_id",
            self._naming.driver_label,
        )
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
        names = self._naming.names
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
        for key, read in CARD_FIELDS:
            if key not in names:  # a field this release line does not collect by default
                continue
            family = _family(names[key])
            for gpu in gpus:
                assert gpu.sample is not None
                _add(family, names[key], card[gpu.index], read(gpu.sample, gpu))
            if key in ("fb_free", "fb_used"):
                self._add_mig_memory(family, names[key], gpus, mig, used=key == "fb_used")
            yield family
        yield from self._codec(gpus, card)
        yield from self._profiling(gpus, card, mig)
        if self._last_xid is not None:
            xid = _family(names["xid"])
            last = self._last_xid()
            for gpu in snapshot.gpus:
                if gpu.info is not None:
                    labels = card.get(gpu.index) or [self._labels(snapshot, gpu)]
                    _add(xid, names["xid"], labels, float(last.get(gpu.index, 0)))
            yield xid

    @staticmethod
    def _add_mig_memory(
        family: Metric,
        spec: Name,
        gpus: list[GpuSnapshot],
        mig: Mapping[tuple[int, int], list[Labels]],
        *,
        used: bool,
    ) -> None:
        """Per MIG device memory, labelled like dcgm-exporter's GPU-instance entities (GPU_I_PROFILE, GPU_I_ID)."""
        for gpu in gpus:
            for m in gpu.mig_instances:
                if isinstance(m.memory_used_bytes, Unsupported):
                    continue
                value = m.memory_used_bytes if used else m.memory_total_bytes - m.memory_used_bytes
                _add(family, spec, mig[(gpu.index, m.gpu_instance_id)], float(value))

    def _codec(self, gpus: list[GpuSnapshot], card: Mapping[int, list[Labels]]) -> Iterator[Metric]:
        enc_spec, dec_spec = self._naming.names["encoder_util"], self._naming.names["decoder_util"]
        enc, dec = _family(enc_spec), _family(dec_spec)
        for gpu in gpus:
            if gpu.profiling is not None:
                _add(enc, enc_spec, card[gpu.index], _opt(gpu.profiling.encoder_utilization_ratio))
                _add(dec, dec_spec, card[gpu.index], _opt(gpu.profiling.decoder_utilization_ratio))
        return iter((enc, dec))

    def _profiling(
        self, gpus: list[GpuSnapshot], card: Mapping[int, list[Labels]], mig: Mapping[tuple[int, int], list[Labels]]
    ) -> Iterator[Metric]:
        names = self._naming.names
        for key, metric in (*PROF_ACTIVITY, *PROF_NVLINK):
            spec = names[key]
            family = _family(spec)
            for gpu in gpus:
                whole = gpu.profiling.card if gpu.profiling is not None else None
                if whole is not None:
                    _add(family, spec, card[gpu.index], whole.metrics.get(metric))
                if (key, metric) in PROF_ACTIVITY and gpu.profiling is not None:
                    for gi, reading in sorted(gpu.profiling.mig.items()):
                        if (gpu.index, gi) in mig:
                            _add(family, spec, mig[(gpu.index, gi)], reading.metrics.get(metric))
            yield family
        for key in ("prof_pcie_tx", "prof_pcie_rx"):
            spec = names[key]
            family = _family(spec)
            for gpu in gpus:
                sent, received, _source = pcie_rates(gpu)
                _add(family, spec, card[gpu.index], sent if key == "prof_pcie_tx" else received)
            yield family
        spec = names["nvlink_total"]
        total = _family(spec)
        for gpu in gpus:
            whole = gpu.profiling.card if gpu.profiling is not None else None
            _add(total, spec, card[gpu.index], _nvlink_total(whole))
        yield total


def _nvlink_total(reading: ProfilingSample | None) -> float | None:
    """Bytes per second over all links, both directions."""
    if reading is None:
        return None
    tx, rx = reading.metrics.get(M.NVLINK_TX_BYTES_PER_SECOND), reading.metrics.get(M.NVLINK_RX_BYTES_PER_SECOND)
    return None if tx is None or rx is None else tx + rx


def _add(family: Metric, spec: Name, label_sets: list[Labels], base_value: float | None) -> None:
    """``base_value`` (in the base unit) in ``spec``'s unit, once per label set."""
    if base_value is None:
        return
    value = base_value * spec.multiply / spec.divide
    if spec.integer:
        value = float(math.trunc(value))
    for labels in label_sets:
        family.add_sample(family.name, labels, value)
