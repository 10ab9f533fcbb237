"""Profiling metrics (NVML GPM) per card and per MIG instance, and encoder/decoder utilization.

Every value is an average over the last sampling interval (two GPM samples bracket it). Only what the card
answered is exported: a card without GPM, or a metric it does not support, has no series, never a 0. Card series
carry ``gpu`` and ``uuid``; MIG series add ``gpu_instance_id`` (join ``xpu_mig_instance_info`` for the profile).
PCIe rates are in the card collector (``xpu_gpu_pcie_*_bytes_per_second``), which also covers cards without GPM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.backends.types import DeviceProfiling, MediaEngine, ProfilingMetric, ProfilingSample, Unsupported
from exporter.collectors.base import GPU_LABELS, gpu_labels
from exporter.collectors.mig import MIG_LABELS
from exporter.collectors.series import Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import Snapshot

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


_Spec = tuple[_Family, Family]


def _families(prefix: str, labels: tuple[str, ...], specs: tuple[_Family, ...]) -> tuple[_Spec, ...]:
    return tuple(
        (spec, Family(f"{prefix}_{spec.suffix}", spec.help, labels=(*labels, spec.label) if spec.label else labels))
        for spec in specs
    )


CARD = _families("xpu_gpu", GPU_LABELS, (*ACTIVITY, *NVLINK))
MIG = _families("xpu_mig", MIG_LABELS, ACTIVITY)
ENGINES = {
    engine: Family(f"xpu_gpu_{engine.value}_active_ratio", text, labels=GPU_LABELS)
    for engine, text in ENGINE_HELP.items()
}
ENCODER = Family(
    "xpu_gpu_encoder_utilization_ratio",
    "Share of time the video encoders were busy, as the driver samples it (nvmlDeviceGetEncoderUtilization).",
    labels=GPU_LABELS,
)
DECODER = Family(
    "xpu_gpu_decoder_utilization_ratio",
    "Share of time the video decoders were busy, as the driver samples it (nvmlDeviceGetDecoderUtilization).",
    labels=GPU_LABELS,
)
SUPPORTED = Family(
    "xpu_gpu_profiling_supported",
    "Whether the card answers NVML's GPM profiling API (1) or not (0: no xpu_gpu_*_active_ratio series).",
    labels=GPU_LABELS,
)
FAMILIES = (
    SUPPORTED,
    *(family for _, family in CARD),
    *ENGINES.values(),
    ENCODER,
    DECODER,
    *(family for _, family in MIG),
)


def _add(rows: Rows, families: tuple[_Spec, ...], values: tuple[str, ...], reading: ProfilingSample) -> None:
    for spec, family in families:
        for label, metric in spec.readings:
            value = reading.metrics.get(metric)
            if value is not None:
                rows.add(family, (*values, label) if spec.label else values, value)


class ProfilingCollector(SeriesCollector):
    """One block per card (its card and MIG readings), kept while its DeviceProfiling is unchanged."""

    name = "profiling"

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(*FAMILIES)
        for gpu in snapshot.gpus:
            if not gpu.fresh or gpu.info is None or gpu.profiling is None:
                continue
            labels = gpu_labels(gpu)
            rows = out.block(gpu.index, (labels, gpu.profiling))
            if rows is not None:
                _card(rows, labels, gpu.profiling)


def _card(rows: Rows, labels: tuple[str, str], p: DeviceProfiling) -> None:
    rows.add(SUPPORTED, labels, 1.0 if p.gpm_supported else 0.0)
    if p.card is not None:
        _add(rows, CARD, labels, p.card)
        for engine, busy in _engine_means(p.card).items():
            rows.add(ENGINES[engine], labels, busy)
    for family, ratio in ((ENCODER, p.encoder_utilization_ratio), (DECODER, p.decoder_utilization_ratio)):
        if not isinstance(ratio, Unsupported):
            rows.add(family, labels, ratio)
    for gi, reading in sorted(p.mig.items()):  # the MIG families' lines, in this card's block too
        _add(rows, MIG, (*labels, str(gi)), reading)


def _engine_means(reading: ProfilingSample) -> dict[MediaEngine, float]:
    """Mean busy ratio per kind of engine the card answered for (one series per kind, not per engine: an H200 has
    7 NVDEC and 7 NVJPG engines, and the per-engine split rarely matters)."""
    kinds: dict[MediaEngine, list[float]] = {}
    for (engine, _n), busy in reading.engines.items():
        kinds.setdefault(engine, []).append(busy)
    return {engine: sum(values) / len(values) for engine, values in kinds.items()}
