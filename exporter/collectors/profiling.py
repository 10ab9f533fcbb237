"""Profiling metrics (NVML GPM) per card and per MIG instance, and encoder/decoder utilization.

Every value is an average over the last sampling interval (two GPM samples bracket it). Only what the card
answered is exported: a card without GPM, or a metric it does not support, has no series, never a 0. Card series
carry ``gpu`` and ``uuid``; MIG series add ``gpu_instance_id`` (join ``xpu_mig_instance_info`` for the profile).
PCIe rates are in the card collector (``xpu_gpu_pcie_*_bytes_per_second``), which also covers cards without GPM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.backends.types import DeviceProfiling, MediaEngine, ProfilingMetric, ProfilingSample, Unsupported
from exporter.collectors.base import GPU_LABELS, gpu_label_values
from exporter.collectors.mig import MIG_LABELS
from exporter.snapshot import GpuSnapshot, Snapshot

M = ProfilingMetric


@dataclass(frozen=True, slots=True)
class _Family:
    suffix: str  # after xpu_gpu_ / xpu_mig_
    help: str
    readings: tuple[tuple[str, ProfilingMetric], ...]  # (label value, metric); label "" = no extra label
    label: str = ""


ACTIVITY: tuple[_Family, ...] = (
    _Family(
        "graphics_engine_active_ratio",
        "Share of time the graphics/compute engine was busy (GPM GRAPHICS_UTIL, DCGM GR_ENGINE_ACTIVE).",
        (("", M.GRAPHICS_ACTIVE),),
    ),
    _Family(
        "sm_active_ratio",
        "Share of SM cycles with at least one warp resident, averaged over all SMs (GPM SM_UTIL, DCGM SM_ACTIVE).",
        (("", M.SM_ACTIVE),),
    ),
    _Family(
        "sm_occupancy_ratio",
        "Resident warps over the SMs' maximum, averaged over time (GPM SM_OCCUPANCY, DCGM SM_OCCUPANCY).",
        (("", M.SM_OCCUPANCY),),
    ),
    _Family(
        "tensor_active_ratio",
        "Share of cycles a tensor pipe was busy: pipe=any for any kind (DCGM PIPE_TENSOR_ACTIVE), or one kind "
        "(hmma, imma, dfma, dmma). The kinds overlap 'any' and do not add up to it.",
        (
            ("any", M.TENSOR_ACTIVE),
            ("hmma", M.TENSOR_HMMA_ACTIVE),
            ("imma", M.TENSOR_IMMA_ACTIVE),
            ("dfma", M.TENSOR_DFMA_ACTIVE),
            ("dmma", M.TENSOR_DMMA_ACTIVE),
        ),
        label="pipe",
    ),
    _Family(
        "dram_active_ratio",
        "Share of cycles the device memory interface was sending or receiving (GPM DRAM_BW_UTIL, DCGM DRAM_ACTIVE).",
        (("", M.DRAM_ACTIVE),),
    ),
    _Family(
        "pipe_active_ratio",
        "Share of cycles a non-tensor math pipe was busy, by pipe (fp64, fp32, fp16, integer; DCGM PIPE_*_ACTIVE).",
        (("fp64", M.FP64_ACTIVE), ("fp32", M.FP32_ACTIVE), ("fp16", M.FP16_ACTIVE), ("integer", M.INTEGER_ACTIVE)),
        label="pipe",
    ),
)
NVLINK: tuple[_Family, ...] = (
    _Family(
        "nvlink_transmit_bytes_per_second",
        "NVLink bytes sent per second over all links, last interval (GPM NVLINK_TOTAL_TX_PER_SEC).",
        (("", M.NVLINK_TX_BYTES_PER_SECOND),),
    ),
    _Family(
        "nvlink_receive_bytes_per_second",
        "NVLink bytes received per second over all links, last interval (GPM NVLINK_TOTAL_RX_PER_SEC).",
        (("", M.NVLINK_RX_BYTES_PER_SECOND),),
    ),
)
ENGINE_HELP: Mapping[MediaEngine, str] = {
    MediaEngine.NVDEC: "Share of time the video decoder (NVDEC) engines were busy, mean over the card's engines "
    "(GPM NVDEC_n_UTIL).",
    MediaEngine.NVJPG: "Share of time the JPEG decoder (NVJPG) engines were busy, mean over the card's engines "
    "(GPM NVJPG_n_UTIL).",
    MediaEngine.NVOFA: "Share of time the optical-flow accelerators (NVOFA) were busy, mean over the card's engines "
    "(GPM NVOFA_n_UTIL).",
    MediaEngine.NVENC: "Share of time the video encoder (NVENC) engines were busy, mean over the card's engines "
    "(GPM NVENC_n_UTIL).",
}


def _families(prefix: str, labels: list[str], specs: Iterable[_Family]) -> list[tuple[_Family, GaugeMetricFamily]]:
    out = []
    for spec in specs:
        names = [*labels, spec.label] if spec.label else labels
        out.append((spec, GaugeMetricFamily(f"{prefix}_{spec.suffix}", spec.help, labels=names)))
    return out


def _add(families: list[tuple[_Family, GaugeMetricFamily]], values: list[str], reading: ProfilingSample) -> None:
    for spec, family in families:
        for label, metric in spec.readings:
            value = reading.metrics.get(metric)
            if value is not None:
                family.add_metric(values + ([label] if spec.label else []), value)


class ProfilingCollector:
    name = "profiling"

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        return list(self._collect(snapshot))

    def _collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        gpus = [g for g in snapshot.gpus if g.fresh and g.info is not None and g.profiling is not None]
        card_labels, mig_labels = list(GPU_LABELS), list(MIG_LABELS)
        card = _families("xpu_gpu", card_labels, (*ACTIVITY, *NVLINK))
        mig = _families("xpu_mig", mig_labels, ACTIVITY)
        engines = {
            engine: GaugeMetricFamily(f"xpu_gpu_{engine.value}_active_ratio", text, labels=card_labels)
            for engine, text in ENGINE_HELP.items()
        }
        codec = (
            GaugeMetricFamily(
                "xpu_gpu_encoder_utilization_ratio",
                "Share of time the video encoders were busy, as the driver samples it "
                "(nvmlDeviceGetEncoderUtilization).",
                labels=card_labels,
            ),
            GaugeMetricFamily(
                "xpu_gpu_decoder_utilization_ratio",
                "Share of time the video decoders were busy, as the driver samples it "
                "(nvmlDeviceGetDecoderUtilization).",
                labels=card_labels,
            ),
        )
        supported = GaugeMetricFamily(
            "xpu_gpu_profiling_supported",
            "Whether the card answers NVML's GPM profiling API (1) or not (0: no xpu_gpu_*_active_ratio series).",
            labels=card_labels,
        )
        for gpu in gpus:
            self._card(gpu, card, engines, codec, supported)
            for gi, reading in sorted(_profiling(gpu).mig.items()):
                _add(mig, [*gpu_label_values(gpu), str(gi)], reading)
        yield supported
        yield from (family for _, family in card)
        yield from engines.values()
        yield from codec
        yield from (family for _, family in mig)

    @staticmethod
    def _card(
        gpu: GpuSnapshot,
        card: list[tuple[_Family, GaugeMetricFamily]],
        engines: Mapping[MediaEngine, GaugeMetricFamily],
        codec: tuple[GaugeMetricFamily, GaugeMetricFamily],
        supported: GaugeMetricFamily,
    ) -> None:
        p, values = _profiling(gpu), gpu_label_values(gpu)
        supported.add_metric(values, 1.0 if p.gpm_supported else 0.0)
        if p.card is not None:
            _add(card, values, p.card)
            for engine, busy in _engine_means(p.card).items():
                engines[engine].add_metric(values, busy)
        for family, ratio in zip(codec, (p.encoder_utilization_ratio, p.decoder_utilization_ratio), strict=True):
            if not isinstance(ratio, Unsupported):
                family.add_metric(values, ratio)


def _engine_means(reading: ProfilingSample) -> dict[MediaEngine, float]:
    """Mean busy ratio per kind of engine the card answered for (one series per kind, not per engine: an H200 has
    7 NVDEC and 7 NVJPG engines, and the per-engine split rarely matters)."""
    kinds: dict[MediaEngine, list[float]] = {}
    for (engine, _n), busy in reading.engines.items():
        kinds.setdefault(engine, []).append(busy)
    return {engine: sum(values) / len(values) for engine, values in kinds.items()}


def _profiling(gpu: GpuSnapshot) -> DeviceProfiling:
    assert gpu.profiling is not None
    return gpu.profiling
