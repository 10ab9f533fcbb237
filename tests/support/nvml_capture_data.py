"""The H200 capture behind the fake pynvml (tests/support/nvml_capture_fake.py): the recorded answers, NVML's error
codes by name, and the modelled GPM and PCIe throughput readings the capture lacks."""

from __future__ import annotations

import ctypes
import functools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

from tests.support.paths import TESTS

CAPTURE_DIR = TESTS / "fixtures" / "h200"
INVENTORY_PATH = CAPTURE_DIR / "nvml-inventory.json"
MIG_PROBE_PATH = CAPTURE_DIR / "mig-probe.log"

U32_SPAN = 1 << 32
H200_NVLINKS = 18  # links the capture probed (all NotSupported in its VM); past the last one NVML says InvalidArgument
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process while MIG is off

# Not in nvml-inventory.json; taken from nvidia-smi-q.txt of the same card ("Max Clocks").
MAX_CLOCKS_MHZ = {pynvml.NVML_CLOCK_GRAPHICS: 1980, pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}
MAX_CLOCKS_MHZ_VIDEO = 1545
# The process the MIG probe started (mig-probe.log): pid, used memory, SM and memory utilisation percent.
CAPTURED_PROCESS = (847, 1990197248, 82, 18)

# "NVMLError_NotSupported" -> NVML_ERROR_NOT_SUPPORTED, from pynvml's own table of error classes.
_ERROR_CODES: dict[str, int] = {cls.__name__: code for code, cls in pynvml.NVMLError._valClassMapping.items()}
_ERROR_TEXT: dict[str, int] = {
    "Not Supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "Not Found": pynvml.NVML_ERROR_NOT_FOUND,
    "Invalid Argument": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "Timeout": pynvml.NVML_ERROR_TIMEOUT,
}


def error_code(text: str) -> int:
    """The NVML return code of a captured error: ``NVMLError_NotSupported:...``, ``...(3)`` or ``Not Supported``."""
    if text in _ERROR_TEXT:
        return _ERROR_TEXT[text]
    name = re.split(r"[:(]", text, maxsplit=1)[0].strip()
    if name not in _ERROR_CODES:
        raise ValueError(f"unknown NVML error in the capture: {text!r}")
    return _ERROR_CODES[name]


@dataclass(frozen=True)
class Capture:
    system: dict[str, Any]
    device: dict[str, Any]
    fields: dict[int, tuple[int, int | float]]  # field id -> (valueType, value) for the fields the card answered
    gi_profiles: dict[int, dict[str, Any] | int]  # profile constant -> profile info, or the NVML error code
    placements: dict[int, tuple[tuple[int, int], ...]]  # profile id -> (start, size) placements


@functools.cache
def load_capture() -> Capture:
    inventory = json.loads(INVENTORY_PATH.read_text())
    device = inventory["devices"][0]
    fields: dict[int, tuple[int, int | float]] = {}
    for name, value in device["field_values_ok"].items():
        fid = getattr(pynvml, name, None)
        if fid is None:  # a field this pynvml does not name
            continue
        kind = int(value["type"])
        fields[int(fid)] = (kind, float(value["d"]) if kind == pynvml.NVML_VALUE_TYPE_DOUBLE else int(value["u64"]))
    gi_profiles: dict[int, dict[str, Any] | int] = {}
    for const, info in device["mig_profiles"].items():
        gi_profiles[int(const)] = error_code(info) if isinstance(info, str) else info
    placements: dict[int, tuple[tuple[int, int], ...]] = {}
    for line in MIG_PROBE_PATH.read_text().splitlines():
        if not line.startswith('{"profile_const"'):
            continue
        probe = json.loads(line)
        if "id" in probe:
            placements[int(probe["id"])] = tuple((int(start), int(size)) for start, size in probe["placements"])
        else:  # constants the inventory did not list (16, 17): the probe's own error
            gi_profiles.setdefault(int(probe["profile_const"]), error_code(probe["v2_err"]))
    return Capture(inventory["system"], device, fields, gi_profiles, placements)


def _value(entry: dict[str, Any]) -> Any:
    """A captured reading, or its NVML error raised as pynvml would."""
    if entry.get("error"):
        raise pynvml.NVMLError(error_code(entry["error"]))
    return entry["value"]


def _out(ref: Any) -> Any:
    """The object behind a ``ctypes.byref`` argument (or the object itself)."""
    return getattr(ref, "_obj", ref)


# --- GPM and throughput: modelled ------------------------------------------------------------------------------
# The capture did not query GPM, the decoder or RX throughput. What follows models an H200 (Hopper: GPM supported)
# from what the capture and nvidia-smi -q of the same card did say: the card was idle (utilization 0 %, encoder,
# decoder, JPEG and OFA 0 %), PCIe TX 1547 KB/s (nvmlDeviceGetPcieThroughput), RX 592 KB/s (nvidia-smi -q).
GPM_PCIE_TX_KBS = 1547  # nvml-inventory.json pcie_tx_kbs
GPM_PCIE_RX_KBS = 592  # nvidia-smi-q.txt "Rx Throughput"
H200_MEDIA_ENGINES = {30: 7, 40: 7, 50: 1}  # first GPM metric id -> engines: 7 NVDEC, 7 NVJPG, 1 NVOFA (no NVENC)
_GPM_ACTIVITY_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)  # ratios in percent, all 0 on the idle card
_GPM_PCIE_TX, _GPM_PCIE_RX, _GPM_NVLINK_RX, _GPM_NVLINK_TX = 20, 21, 60, 61  # MiB/s


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class GpmModel:
    """Hardware counters that integrate each metric over time: a GPM sample records the integrals, and
    nvmlGpmMetricsGet divides their difference by the time between two samples, as the card's counters do.

    Time is the monotonic clock until a test calls :meth:`advance`, which freezes it and moves it by hand (pass
    ``monotonic=fake.gpm.clock`` to NvmlBackend so both agree).

    ``refused`` are metric ids this driver does not take. nvml.h does not say how a driver answers an id it does not
    define (one whose enum entry its header lacks, or past its NVML_GPM_METRIC_MAX), so both ways are modelled:
    with ``refuse_whole_request`` the whole nvmlGpmMetricsGet fails with INVALID_ARGUMENT (then no metric of the
    request is filled), otherwise only that metric's own nvmlReturn says INVALID_ARGUMENT. ``requested`` records the
    ids of every nvmlGpmMetricsGet.
    """

    supported: bool = True
    nvlinks: int = 0
    manual: float | None = None  # set by advance(): the clock no longer follows time.monotonic
    activity: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)  # (gpu, gi or -1) -> id -> value
    integrals: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    updated_at: dict[tuple[int, int], float] = field(default_factory=dict)
    samples: dict[int, tuple[tuple[int, int], float, dict[int, float]]] = field(default_factory=dict)
    allocated: set[int] = field(default_factory=set)
    next_sample: int = 0x9000
    refused: set[int] = field(default_factory=set)
    refuse_whole_request: bool = True
    requested: list[list[int]] = field(default_factory=list)

    def clock(self) -> float:
        return time.monotonic() if self.manual is None else self.manual

    def advance(self, seconds: float) -> None:
        self.manual = self.clock() + seconds

    def card_metrics(self) -> dict[int, float]:
        values = dict.fromkeys(_GPM_ACTIVITY_IDS, 0.0)
        values[_GPM_PCIE_TX] = GPM_PCIE_TX_KBS / 1024
        values[_GPM_PCIE_RX] = GPM_PCIE_RX_KBS / 1024
        if self.nvlinks:
            values[_GPM_NVLINK_RX] = values[_GPM_NVLINK_TX] = 0.0
        for first, count in H200_MEDIA_ENGINES.items():
            values.update(dict.fromkeys(range(first, first + count), 0.0))
        return values

    def _catch_up(self, key: tuple[int, int]) -> float:
        """Integrate the entity's values up to now; returns the time it integrated to."""
        now = self.clock()
        if key not in self.activity:
            self.activity[key] = self.card_metrics() if key[1] < 0 else dict.fromkeys(_GPM_ACTIVITY_IDS, 0.0)
            self.integrals[key] = dict.fromkeys(self.activity[key], 0.0)
            self.updated_at[key] = now
        span = now - self.updated_at[key]
        area = self.integrals[key]
        for mid, value in self.activity[key].items():
            area[mid] = area.get(mid, 0.0) + value * span
        self.updated_at[key] = now
        return now

    def set(self, gpu: int, values: dict[int, float], gpu_instance: int = -1) -> None:
        """From now on the card (or GPU instance) runs at these values (percent, or MiB/s for rates)."""
        self._catch_up((gpu, gpu_instance))
        self.activity[(gpu, gpu_instance)].update(values)

    def alloc(self) -> Any:
        self.next_sample += 0x10
        self.allocated.add(self.next_sample)
        return ctypes.cast(ctypes.c_void_p(self.next_sample), pynvml.c_nvmlGpmSample_t)

    def free(self, sample: Any) -> None:
        address = _address(sample)
        if address not in self.allocated:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.allocated.discard(address)
        self.samples.pop(address, None)

    def take(self, key: tuple[int, int], sample: Any) -> None:
        address = _address(sample)
        if address not in self.allocated:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        taken_at = self._catch_up(key)
        self.samples[address] = (key, taken_at, dict(self.integrals[key]))

    def metrics(self, request: Any) -> Any:
        first, second = self.samples.get(_address(request.sample1)), self.samples.get(_address(request.sample2))
        if first is None or second is None or first[0] != second[0] or int(request.version) != 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        span = second[1] - first[1]
        ids = [int(request.metrics[slot].metricId) for slot in range(int(request.numMetrics))]
        self.requested.append(ids)
        if self.refuse_whole_request and self.refused.intersection(ids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for slot in range(int(request.numMetrics)):
            metric = request.metrics[slot]
            mid = int(metric.metricId)
            if mid in self.refused:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0
                continue
            if mid not in first[2] or span <= 0:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
                continue
            metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, (second[2][mid] - first[2][mid]) / span
        return request
