"""Profiling readings of the NVML backend: GPM metrics, encoder/decoder utilization and the PCIe throughput fallback.

GPM (Hopper and later) counts in hardware; NVML turns two samples into metrics for the interval between them
(``nvmlGpmSampleGet`` / ``nvmlGpmMigSampleGet``, then ``nvmlGpmMetricsGet``). :class:`NvmlProfiling` keeps the
previous sample of each card and MIG GPU instance, so every call returns the average over the time since the last
one. NVML documents a floor of about 100 ms between the two samples; a call sooner than that returns nothing for
that device and keeps the older sample as the start of the next interval.

Only metric ids that the running driver's branch defines are asked for (``defined_metric_ids``). When the driver
still refuses a whole ``nvmlGpmMetricsGet``, the ids are asked one at a time once, the ones it refuses are
remembered for that card and left out from then on, and the others keep their series. A card-level GPM failure
with MIG on leaves the MIG instances' readings alone.

Every NVML call here runs on the calling thread (the card's lane); no lock is held across a driver call, so a
card whose GPM call hangs stalls only its own lane.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import pynvml
import structlog

from exporter.backends.errors import (
    BackendError,
    DriverUnavailableError,
    GpuLostError,
    ResetRequiredError,
    VersionMismatchError,
)
from exporter.backends.nvml.calls import UNSUPPORTED_CODES, call, error_code, optional, ratio, scaled, translate
from exporter.backends.nvml.handles import DeviceHandle, GpmSample
from exporter.backends.types import (
    UNSUPPORTED,
    DeviceProfiling,
    MediaEngine,
    MigInstance,
    PcieThroughput,
    ProfilingMetric,
    ProfilingSample,
    Unsupported,
)

log = structlog.get_logger("nvml.gpm")

MIN_INTERVAL_SECONDS: Final = 0.1  # nvml.h: two GPM samples closer than this give unreliable metrics
_MIB: Final = float(1 << 20)
_INSTANCE_GONE: Final = frozenset({pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT})

# NVML_GPM_METRIC_* ids (nvml.h); ratios come as percent, rates as MiB/s.
_CARD_METRICS: Final[Mapping[int, ProfilingMetric]] = {
    1: ProfilingMetric.GRAPHICS_ACTIVE,
    2: ProfilingMetric.SM_ACTIVE,
    3: ProfilingMetric.SM_OCCUPANCY,
    4: ProfilingMetric.INTEGER_ACTIVE,
    5: ProfilingMetric.TENSOR_ACTIVE,
    6: ProfilingMetric.TENSOR_DFMA_ACTIVE,
    7: ProfilingMetric.TENSOR_HMMA_ACTIVE,
    8: ProfilingMetric.TENSOR_DMMA_ACTIVE,
    9: ProfilingMetric.TENSOR_IMMA_ACTIVE,
    10: ProfilingMetric.DRAM_ACTIVE,
    11: ProfilingMetric.FP64_ACTIVE,
    12: ProfilingMetric.FP32_ACTIVE,
    13: ProfilingMetric.FP16_ACTIVE,
    20: ProfilingMetric.PCIE_TX_BYTES_PER_SECOND,
    21: ProfilingMetric.PCIE_RX_BYTES_PER_SECOND,
    60: ProfilingMetric.NVLINK_RX_BYTES_PER_SECOND,
    61: ProfilingMetric.NVLINK_TX_BYTES_PER_SECOND,
}
# A GPU instance owns its SMs and memory slices, not the card's PCIe or NVLink: those stay card metrics.
_MIG_METRICS: Final[Mapping[int, ProfilingMetric]] = {
    mid: metric for mid, metric in _CARD_METRICS.items() if not metric.is_rate
}
# Per-engine utilization: first metric id and how many engines of the kind nvml.h numbers.
_ENGINE_IDS: Final[Mapping[MediaEngine, tuple[int, int]]] = {
    MediaEngine.NVDEC: (30, 8),
    MediaEngine.NVJPG: (40, 8),
    MediaEngine.NVOFA: (50, 2),
    MediaEngine.NVENC: (166, 4),
}
_ENGINE_METRICS: Final[Mapping[int, tuple[MediaEngine, int]]] = {
    first + n: (engine, n) for engine, (first, count) in _ENGINE_IDS.items() for n in range(count)
}

# Which of the ids above a driver branch defines, from NVIDIA's nvml.h as go-nvml carries it (pkg/nvml/nvml.h; every
# header bump is one CUDA version, and a driver's nvmlSystemGetCudaDriverVersion names its own: 12040 on R550,
# 12080 on R570, 13000 on R580). The ids in use, header by header:
#   - NVML 11.8 to 12.5 (go-nvml 71d7509 .. 5f61a8a; R550 is 12.4, f7ceebd): 1-7, 9-13, 20, 21, 30-37, 40-47, 50, 60,
#     61, with NVML_GPM_METRIC_MAX = 98. There is no id 8: the enum goes from HMMA (7) to IMMA (9).
#   - 12.6 (7ec3ff8, R560): adds 51, NVML_GPM_METRIC_NVOFA_1_UTIL. 12.8 (f420a32, R570) is unchanged, MAX still 98.
#   - 12.9 (62ce1e3, R575): adds 166-169, NVML_GPM_METRIC_NVENC_0..3_UTIL; MAX becomes 210. 13.0 (9da9e13, "Bump
#     nvml.h to 13.0.39", R580) and 13.1 (2a1f6c3) are unchanged: still no 8.
#   - 13.2.1 (2976179): adds 8, NVML_GPM_METRIC_DMMA_TENSOR_UTIL; MAX 333. 13.3 (8b8585b) and the newest header
#     (24abee7) add none of the ids used here.
_IDS_IN_EVERY_HEADER: Final = frozenset(
    {*range(1, 8), *range(9, 14), 20, 21, *range(30, 38), *range(40, 48), 50, 60, 61}
)
_IDS_ADDED: Final[tuple[tuple[int, frozenset[int]], ...]] = (  # (first CUDA version whose header has them, ids)
    (12060, frozenset({51})),
    (12090, frozenset(range(166, 170))),
    (13020, frozenset({8})),
)
# Errors that say the card (or the library), not the request, failed: never worth asking metric by metric.
_CARD_FAILURES: Final = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_TIMEOUT,
    }
)
# A failure of the card itself, not of its GPM: MIG instances cannot be read either.
_FATAL: Final = (GpuLostError, ResetRequiredError, DriverUnavailableError, VersionMismatchError)


def defined_metric_ids(cuda_driver_version: int | None) -> frozenset[int]:
    """The GPM metric ids (of those this module reads) the driver of that CUDA version defines; None (unknown):
    the ids every header defines."""
    ids = set(_IDS_IN_EVERY_HEADER)
    for since, added in _IDS_ADDED:
        if cuda_driver_version is not None and cuda_driver_version >= since:
            ids |= added
    return frozenset(ids)


# Every id this module reads, by name (the ProfilingMetric, or the media engine and its number).
METRIC_ID_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {**{mid: str(m) for mid, m in _CARD_METRICS.items()}, **{mid: f"{e}{n}" for mid, (e, n) in _ENGINE_METRICS.items()}}
)


_get = ctypes.Structure.__getattribute__  # the field accessors, without pynvml's printable-structure hooks
_set = ctypes.Structure.__setattr__


@dataclass
class _Bracket:
    """The sample that opens the next interval of one card or GPU instance, and a spare buffer for the next."""

    opening: GpmSample
    spare: GpmSample
    opened_at: float | None = None  # monotonic time the opening sample was taken; None before the first
    supported: bool = True


class NvmlProfiling:
    """GPM state and readings for :class:`exporter.backends.nvml.NvmlBackend` (which owns the handles); NVML errors
    are translated by ``calls.py``."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()  # guards the dictionaries only, never held across an NVML call
        self._support: dict[int, bool] = {}
        self._brackets: dict[tuple[int, int, str], _Bracket] = {}  # (gpu, gpu instance or -1, MIG uuid)
        self._defined: frozenset[int] | None = None  # the ids the driver's branch defines, asked once
        self._refused: dict[int, frozenset[int]] = {}  # per card: ids the driver refused when asked alone
        self._card_errors: set[tuple[int, str, str]] = set()  # card-level failures with MIG on, logged once

    # --- public --------------------------------------------------------------------------------------------

    def read(self, index: int, handle: DeviceHandle, mig_instances: Iterable[MigInstance]) -> DeviceProfiling:
        """GPM of the card and each MIG instance since the previous call, and encoder/decoder utilization."""
        supported = self._gpm_supported(index, handle)
        card: ProfilingSample | None = None
        mig: dict[int, ProfilingSample] = {}
        if supported:
            self._defined_ids()  # asked once, with the first sample (which only opens the interval)
            instances = tuple(mig_instances)
            # The card's own interval starts afresh when MIG instances come or go: a card that refused card-level
            # samples with MIG on is asked again once MIG is off, and no interval spans a mode change.
            card_key = (index, -1, "mig" if instances else "")
            card = self._survive(
                index, instances, functools.partial(self._interval, index, handle, card_key, _CARD_METRICS)
            )
            live = {card_key}
            for inst in instances:
                key = (index, inst.gpu_instance_id, inst.uuid)
                live.add(key)
                reading = self._survive(
                    index, instances, functools.partial(self._interval, index, handle, key, _MIG_METRICS)
                )
                if reading is not None:
                    mig[inst.gpu_instance_id] = reading
            self._drop_gone(index, live)
        return DeviceProfiling(
            gpm_supported=supported,
            card=card,
            mig=MappingProxyType(mig),
            encoder_utilization_ratio=self._codec("nvmlDeviceGetEncoderUtilization", handle),
            decoder_utilization_ratio=self._codec("nvmlDeviceGetDecoderUtilization", handle),
        )

    def pcie_throughput(self, handle: DeviceHandle, clock: Callable[[], float] = time.time) -> PcieThroughput:
        """Both directions of ``nvmlDeviceGetPcieThroughput`` (KB/s over a 20 ms window each)."""
        tx = self._optional("nvmlDeviceGetPcieThroughput", handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._optional("nvmlDeviceGetPcieThroughput", handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return PcieThroughput(
            tx_bytes_per_second=scaled(tx, 1024),
            rx_bytes_per_second=scaled(rx, 1024),
            measured_at=clock(),
        )

    def forget(self) -> None:
        """Free every sample buffer (the library is closing, or the card was reset)."""
        with self._lock:
            brackets, self._brackets = list(self._brackets.values()), {}
            self._support.clear()
            self._refused.clear()
            self._card_errors.clear()
            self._defined = None
        for bracket in brackets:
            self._free(bracket)

    def refused_metric_ids(self, index: int) -> frozenset[int]:
        """Metric ids this card's driver refused when asked alone; they are no longer asked for."""
        with self._lock:
            return self._refused.get(index, frozenset())

    # --- GPM -----------------------------------------------------------------------------------------------

    def _survive(
        self, index: int, instances: tuple[MigInstance, ...], read: Callable[[], ProfilingSample | None]
    ) -> ProfilingSample | None:
        """``read()``; with MIG instances on the card, a GPM failure of one part (the card level, one instance) is
        logged once and skips that part only. A failure of the card itself (lost, reset needed) always propagates."""
        try:
            return read()
        except BackendError as exc:
            if not instances or isinstance(exc, _FATAL):
                raise
            seen = (index, exc.call, exc.code)
            with self._lock:
                first = seen not in self._card_errors
                self._card_errors.add(seen)
            if first:
                log.warning("GPM reading failed; the card's other GPM readings go on", gpu=index, error=str(exc))
            return None

    def _defined_ids(self) -> frozenset[int]:
        with self._lock:
            known = self._defined
        if known is not None:
            return known
        version = self._optional("nvmlSystemGetCudaDriverVersion_v2")
        if isinstance(version, Unsupported):
            version = self._optional("nvmlSystemGetCudaDriverVersion")
        ids = defined_metric_ids(None if isinstance(version, Unsupported) else int(version))
        with self._lock:
            self._defined = ids
        return ids

    def _gpm_supported(self, index: int, handle: DeviceHandle) -> bool:
        with self._lock:
            known = self._support.get(index)
        if known is not None:
            return known
        answer = self._optional("nvmlGpmQueryDeviceSupport", handle)
        supported = not isinstance(answer, Unsupported) and bool(answer.isSupportedDevice)
        with self._lock:
            self._support[index] = supported
        return supported

    def _bracket(self, key: tuple[int, int, str]) -> _Bracket:
        with self._lock:
            bracket = self._brackets.get(key)
        if bracket is not None:
            return bracket
        opening = call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
        try:
            spare = call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
        except BackendError:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlGpmSampleFree(opening)
            raise
        bracket = _Bracket(opening, spare)
        with self._lock:
            self._brackets[key] = bracket
        return bracket

    def _interval(
        self, index: int, handle: DeviceHandle, key: tuple[int, int, str], ids: Mapping[int, ProfilingMetric]
    ) -> ProfilingSample | None:
        bracket = self._bracket(key)
        if not bracket.supported:
            return None
        now = self._monotonic()
        if bracket.opened_at is not None and now - bracket.opened_at < MIN_INTERVAL_SECONDS:
            return None
        gi = key[1]
        try:
            if gi < 0:
                pynvml.nvmlGpmSampleGet(handle, bracket.spare)
            else:
                pynvml.nvmlGpmMigSampleGet(handle, gi, bracket.spare)
        except pynvml.NVMLError as err:
            if error_code(err) in UNSUPPORTED_CODES:
                bracket.supported = False  # e.g. card-level GPM while MIG is on: ask the instances only
                return None
            if gi >= 0 and error_code(err) in _INSTANCE_GONE:
                return None  # destroyed since it was listed; the next listing drops it
            raise translate(err, "nvmlGpmMigSampleGet" if gi >= 0 else "nvmlGpmSampleGet") from err
        opened_at = bracket.opened_at
        bracket.opening, bracket.spare, bracket.opened_at = bracket.spare, bracket.opening, now
        if opened_at is None:
            return None  # the first sample only opens the interval
        # after the swap: ``spare`` holds the older sample, ``opening`` the one just taken
        engines = gi < 0  # the media engines are the card's
        wanted = [*ids, *(_ENGINE_METRICS if engines else ())]
        values = self._metrics(index, bracket.spare, bracket.opening, wanted)
        metrics = {ids[mid]: _convert(ids[mid], v) for mid, v in values.items() if mid in ids}
        busy = {_ENGINE_METRICS[mid]: ratio(v) for mid, v in values.items() if mid in _ENGINE_METRICS}
        return ProfilingSample(
            interval_seconds=now - opened_at, metrics=MappingProxyType(metrics), engines=MappingProxyType(busy)
        )

    def _metrics(self, index: int, older: GpmSample, newer: GpmSample, ids: list[int]) -> dict[int, float]:
        """The metrics of the interval between two samples, of the ids the driver defines and has not refused.

        One ``nvmlGpmMetricsGet`` asks for them all. Should the driver refuse that whole request, each id is asked
        alone (once: the refused ones are remembered for this card), so one id it does not take costs that metric,
        not every GPM series of the card. Metrics the device does not answer are left out."""
        defined = self._defined_ids()
        with self._lock:
            refused = self._refused.get(index, frozenset())
        ids = [mid for mid in ids if mid in defined and mid not in refused]
        try:
            return self._metrics_get(older, newer, ids)
        except pynvml.NVMLError as err:
            if error_code(err) in _CARD_FAILURES or len(ids) < 2:
                raise translate(err, "nvmlGpmMetricsGet") from err
            whole = err
        answered: dict[int, float] = {}
        refused_now: list[int] = []
        for mid in ids:
            try:
                answered.update(self._metrics_get(older, newer, [mid]))
            except pynvml.NVMLError as err:
                if error_code(err) in _CARD_FAILURES:
                    raise translate(err, "nvmlGpmMetricsGet") from err
                refused_now.append(mid)
        if len(refused_now) == len(ids):  # refused whatever it asks: the call fails, not the ids
            raise translate(whole, "nvmlGpmMetricsGet") from whole
        with self._lock:
            self._refused[index] = refused | frozenset(refused_now)
        log.warning(
            "the driver refused GPM metric ids; asking without them from now on",
            gpu=index,
            refused=refused_now,
            error=error_code(whole),
        )
        return answered

    @staticmethod
    def _metrics_get(older: GpmSample, newer: GpmSample, ids: list[int]) -> dict[int, float]:
        """One ``nvmlGpmMetricsGet``; raises ``pynvml.NVMLError`` when the driver refuses the request.

        pynvml's structures route every field access through a Python ``__getattribute__``; the ~45 slots are read
        and written with ctypes' own accessors instead (a third of the call's Python cost)."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        slots = request.metrics
        ids = ids[: len(slots)]
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = older, newer
        for slot, mid in enumerate(ids):
            _set(slots[slot], "metricId", mid)
        pynvml.nvmlGpmMetricsGet(request)
        out: dict[int, float] = {}
        for slot in range(len(ids)):
            metric = slots[slot]
            value = _get(metric, "value")
            if _get(metric, "nvmlReturn") == pynvml.NVML_SUCCESS and math.isfinite(value):
                out[_get(metric, "metricId")] = float(value)
        return out

    def _drop_gone(self, index: int, live: set[tuple[int, int, str]]) -> None:
        """Free the samples of GPU instances (and card modes) that no longer exist on this card."""
        with self._lock:
            gone = [k for k in self._brackets if k[0] == index and k not in live]
            dropped = [self._brackets.pop(k) for k in gone]
        for bracket in dropped:
            self._free(bracket)

    @staticmethod
    def _free(bracket: _Bracket) -> None:
        for sample in (bracket.opening, bracket.spare):
            with contextlib.suppress(pynvml.NVMLError):  # the library may already be shut down
                pynvml.nvmlGpmSampleFree(sample)

    # --- encoder / decoder ----------------------------------------------------------------------------------

    def _codec(self, name: str, handle: DeviceHandle) -> float | Unsupported:
        answer = self._optional(name, handle)
        if isinstance(answer, Unsupported):
            return UNSUPPORTED
        return ratio(answer[0])  # [utilization percent, sampling period us]

    # --- plumbing -------------------------------------------------------------------------------------------

    @staticmethod
    def _optional(name: str, *args: object) -> Any | Unsupported:
        fn = getattr(pynvml, name, None)  # looked up per call: an older nvidia-ml-py may lack the wrapper
        return UNSUPPORTED if fn is None else optional(name, fn, *args)


def _convert(metric: ProfilingMetric, value: float) -> float:
    """Percent -> ratio 0-1; MiB/s -> bytes/s (never negative)."""
    return max(value, 0.0) * _MIB if metric.is_rate else ratio(value)


__all__ = ["METRIC_ID_NAMES", "MIN_INTERVAL_SECONDS", "NvmlProfiling", "defined_metric_ids"]
