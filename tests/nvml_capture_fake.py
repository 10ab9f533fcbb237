"""A fake ``pynvml`` for :class:`exporter.backends.nvml.NvmlBackend`, answering from a real H200 capture.

The answers come from ``tests/fixtures/h200`` (``nvml-inventory.json`` and ``mig-probe.log``), measured on one
NVIDIA H200 SXM in a VM: no NVLink, MIG off, ECC on. :func:`install` monkeypatches every ``pynvml`` function the
backend calls; NVML errors are raised as ``pynvml.NVMLError(code)``, as the real wrappers do, and wherever the
capture says "Not Supported" the fake raises NotSupported (fan, NUMA node, retired pages, NVLink when
``nvlinks=0``). Readings the capture lacks are modelled and marked as such below (GPM: :class:`GpmModel`).

Knobs on the returned :class:`FakeNvml`: ``fail(call, code)`` makes one NVML function fail, ``lose_gpu()`` makes
every device call answer GPU_IS_LOST (one card's, or all), ``recover_gpu()`` brings a lost card back as a reset
does, ``reset_gpu()`` resets a card between two calls, ``set_mig()`` changes MIG mode as nvmlDeviceSetMigMode does
(the card is reset: new handles, a new minor number), ``unprivileged()`` makes the parent card's process list
answer NO_PERMISSION while MIG is on, ``advance_pcie()`` moves the 32-bit PCIe byte counters, ``post_xid()`` raises an
XID (optionally inside a MIG instance), ``add_captured_process()`` adds the process the MIG probe saw. ``calls``
counts every NVML call.

Events follow NVML: an event is queued in every live event set that holds a registration of its card made since
the card's last reset; a card reset (or MIG mode change, or loss) ends its registrations, so an event nobody
registered for again is lost (``undelivered`` counts them). A wait on a set holding a lost card's registration
answers GPU_IS_LOST while nothing is queued.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

CAPTURE_DIR = Path(__file__).resolve().parent / "fixtures" / "h200"
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
        for slot in range(int(request.numMetrics)):
            metric = request.metrics[slot]
            mid = int(metric.metricId)
            if mid not in first[2] or span <= 0:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
                continue
            metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, (second[2][mid] - first[2][mid]) / span
        return request


@dataclass
class FakeNvml:
    """The state behind the patched pynvml functions; method names are the NVML calls they stand in for."""

    capture: Capture
    count: int = 1
    nvlinks: int = 0
    mig: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # NVML call -> return code it fails with
    lost: set[int] = field(default_factory=set)  # cards that answer GPU_IS_LOST
    privileged: bool = True  # False: the parent card's process list is NO_PERMISSION while MIG is on
    calls: Counter[str] = field(default_factory=Counter)
    pcie_tx_bytes: int = 0  # true byte totals; NVML reports them modulo 2**32
    pcie_rx_bytes: int = 0
    pcie_step: tuple[int, int] = (0, 0)  # (tx, rx) bytes added after every nvmlDeviceGetFieldValues
    energy_mj: int = 0
    processes: list[tuple[int, int | None, int, int]] = field(default_factory=list)
    initialised: bool = False
    resets: dict[int, int] = field(default_factory=dict)  # gpu -> resets so far (a registration holds one value)
    minor_shift: int = 0  # added to the minor numbers after a MIG mode change
    energy_base: dict[int, int] = field(default_factory=dict)  # gpu -> energy counter value at its last reset
    undelivered: int = 0  # events no live registration was there to take
    gpm: GpmModel = field(default_factory=GpmModel)  # modelled: see GpmModel
    field_overrides: dict[int, tuple[int, int | float]] = field(default_factory=dict)  # field id -> (type, value)

    def __post_init__(self) -> None:
        fields = self.capture.fields
        self.pcie_tx_bytes = int(fields[pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES][1])
        self.pcie_rx_bytes = int(fields[pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES][1])
        self.energy_mj = int(fields[pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION][1])
        self._handle_base = 0x1000
        self.handles = self._new_handles()
        self._sets: dict[int, _EventSet] = {}  # live event sets by address
        self._next_set = 0x7700
        self.gpm.nvlinks = self.nvlinks

    # --- knobs for tests -------------------------------------------------------------------------------------

    def fail(self, call: str, code: int) -> None:
        """Make every later ``call`` raise ``NVMLError(code)`` (``nvmlDeviceGetMemoryInfo_v2``: the v2 form only)."""
        self.errors[call] = code

    def lose_gpu(self, gpu: int | None = None) -> None:
        """The card's device calls (every card's with None) answer GPU_IS_LOST from now on, as NVML does after the
        card falls off the bus; its event registrations end."""
        for index in range(self.count) if gpu is None else (gpu,):
            self.lost.add(index)
            self._end_registrations(index)

    def recover_gpu(self, gpu: int) -> None:
        """The lost card answers again, reset: counters start over and it must be registered for events anew."""
        self.lost.discard(gpu)
        self.reset_gpu(gpu)

    def reset_gpu(self, gpu: int) -> None:
        """A GPU reset between two calls (nvidia-smi -r): energy since load restarts at 0, registrations end."""
        self.energy_base[gpu] = self.energy_mj
        self._end_registrations(gpu)

    def set_mig(self, enabled: bool, *, new_handles: bool = True) -> None:
        """nvmlDeviceSetMigMode on every card, applied by a reset: old handles become invalid (INVALID_ARGUMENT)
        when ``new_handles``, the minor numbers change, registrations end."""
        self.mig = enabled
        self.minor_shift += 8
        if new_handles:
            self._handle_base += 0x10000
            self.handles = self._new_handles()
        for gpu in range(self.count):
            self._end_registrations(gpu)

    def unprivileged(self) -> None:
        self.privileged = False

    def advance_pcie(self, tx_bytes: int, rx_bytes: int) -> None:
        self.pcie_tx_bytes += tx_bytes
        self.pcie_rx_bytes += rx_bytes

    def post_xid(self, gpu: int, xid: int, *, gpu_instance: int | None = None, compute_instance: int = 0) -> None:
        """An XID on the card, or inside its MIG instance (NVML then fills gpuInstanceId/computeInstanceId)."""
        mig = (NO_INSTANCE, NO_INSTANCE) if gpu_instance is None else (gpu_instance, compute_instance)
        self.post_event(gpu, pynvml.nvmlEventTypeXidCriticalError, xid, mig)

    def post_event(
        self, gpu: int, event_type: int, data: int, mig: tuple[int, int] = (NO_INSTANCE, NO_INSTANCE)
    ) -> None:
        taken = False
        for event_set in self._sets.values():
            registration = event_set.registered.get(gpu)
            if registration is not None and registration[1] == self.resets.get(gpu, 0) and registration[0] & event_type:
                event_set.queue.append((gpu, event_type, data, *mig))
                taken = True
        if not taken:
            self.undelivered += 1

    def registered_gpus(self) -> set[int]:
        """Cards whose current registration sits in a live event set (what a posted event would reach)."""
        return {
            gpu
            for event_set in self._sets.values()
            for gpu, (_mask, reset) in event_set.registered.items()
            if reset == self.resets.get(gpu, 0)
        }

    @property
    def live_sets(self) -> int:
        return len(self._sets)

    def add_captured_process(self) -> None:
        self.processes.append(CAPTURED_PROCESS)

    # --- plumbing --------------------------------------------------------------------------------------------

    def _guard(self, call: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)  # keeps the signature: NvmlBackend inspects it for out-reference arguments
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.calls[call] += 1
            if call in self.errors:
                raise pynvml.NVMLError(self.errors[call])
            if self.lost and call.startswith("nvmlDevice") and self._device_of(args) in self.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return fn(*args, **kwargs)

        return guarded

    def _device_of(self, args: tuple[Any, ...]) -> int | None:
        """The card a device call is about: its handle, or the index of nvmlDeviceGetHandleByIndex."""
        if not args:
            return None
        if isinstance(args[0], int):
            return args[0]
        address = ctypes.cast(args[0], ctypes.c_void_p).value if args[0] is not None else None
        return next((i for i, h in enumerate(self.handles) if ctypes.cast(h, ctypes.c_void_p).value == address), None)

    def _new_handles(self) -> list[Any]:
        return [
            ctypes.cast(ctypes.c_void_p(self._handle_base + 0x100 * i), pynvml.c_nvmlDevice_t)
            for i in range(self.count)
        ]

    def _end_registrations(self, gpu: int) -> None:
        self.resets[gpu] = self.resets.get(gpu, 0) + 1

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for index, h in enumerate(self.handles):
            if ctypes.cast(h, ctypes.c_void_p).value == address:
                return index
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _dev(self, key: str) -> Any:
        return _value(self.capture.device[key])

    # --- library and system ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(_value(self.capture.system["driver"]))

    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(_value(self.capture.system["nvml_version"]))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(_value(self.capture.system["cuda_driver"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(_value(self.capture.system["cuda_driver"]))

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < self.count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._index(handle)

    # --- identity --------------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._dev("name"))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        uuid = str(self._dev("uuid"))
        index = self._index(handle)
        return uuid if index == 0 else f"{uuid[:-4]}{index:04x}"  # more cards: the captured UUID, renumbered

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return str(self._dev("serial"))

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        pci = self._dev("pci")
        index = self._index(handle)
        info = pynvml.nvmlPciInfo_t()
        info.domain, info.bus, info.device = pci["domain"], pci["bus"], pci["device"] + index
        info.pciDeviceId, info.pciSubSystemId = pci["pciDeviceId"], pci["pciSubSystemId"]
        info.busId = f"{info.domain:08x}:{info.bus:02x}:{info.device:02x}.0".encode()
        info.busIdLegacy = f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.0".encode()
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(self._dev("minor")) + self._index(handle) + self.minor_shift

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._dev("cc")
        return int(major), int(minor)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return str(self._dev("vbios"))

    # --- memory, clocks, power, PCIe -------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        memory = self._dev("memory")
        if version is None:
            info = pynvml.c_nvmlMemory_t()
            info.total, info.free, info.used = memory["total"], memory["free"], memory["used"]
            return info
        if "nvmlDeviceGetMemoryInfo_v2" in self.errors:
            raise pynvml.NVMLError(self.errors["nvmlDeviceGetMemoryInfo_v2"])
        # The capture read v1 only, which folds driver-reserved memory into "used"; nvidia-smi -q of the same card
        # shows Used 0 MiB and Reserved 616 MiB, so v2 reports v1's "used" as reserved.
        info = pynvml.c_nvmlMemory_v2_t()
        info.version = version
        info.total, info.free, info.reserved, info.used = memory["total"], memory["free"], memory["used"], 0
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        util = self._dev("util")
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = util["gpu"], util["memory"]
        return rates

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._dev("temp"))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._dev("power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._dev("power_limit_mw"))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return int(self._dev("power_limit_mw"))  # nvidia-smi -q: default = current = 700 W

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._dev("energy_mj"))  # 4.5 ms on the card: NvmlBackend reads the energy field instead

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        if clock == pynvml.NVML_CLOCK_SM:
            return int(self._dev("clk_sm"))
        if clock == pynvml.NVML_CLOCK_MEM:
            return int(self._dev("clk_mem"))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        if clock == pynvml.NVML_CLOCK_SM:
            return int(self._dev("clk_sm_max"))
        if clock == pynvml.NVML_CLOCK_VIDEO:
            return MAX_CLOCKS_MHZ_VIDEO
        if clock in MAX_CLOCKS_MHZ:
            return MAX_CLOCKS_MHZ[clock]
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._dev("clocks_event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(self._dev("clocks_event_reasons"))

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return int(self._dev("pstate"))

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return int(self._dev("compute_mode"))

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return int(self._dev("persistence"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._dev("pcie_gen"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return int(self._dev("pcie_width"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._dev("pcie_gen_max"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return int(self._dev("pcie_width_max"))

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        cor, unc, pending, failure = self._dev("remapped_rows")
        return int(cor), int(unc), int(pending), int(failure)

    # readings the card does not have (NvmlBackend does not ask for them; here so a caller gets what NVML says)

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        return int(self._dev("fan"))

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return int(self._dev("numa"))

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        return list(self._dev("retired_pages_dbe"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return int(self._dev("retired_pending"))

    # --- field values ----------------------------------------------------------------------------------------

    def _nvlink_field(self, fid: int, scope: int) -> tuple[int, int] | None:
        """NVLink counters (not in the capture, whose card has no NVLink): zero on every modelled link."""
        if not self.nvlinks:
            return None
        throughput = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}
        if fid in throughput:
            return (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 0) if scope < self.nvlinks else None
        for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"):
            for link in range(min(self.nvlinks, 12)):
                if fid == getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}", None):
                    return (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 0)
        return None

    def _field(self, fid: int, scope: int, gpu: int = 0) -> tuple[int, int | float] | None:
        if fid in self.field_overrides:
            return self.field_overrides[fid]
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, self.pcie_tx_bytes % U32_SPAN
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, self.pcie_rx_bytes % U32_SPAN
        if fid in (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_ENERGY):
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, self.energy_mj - self.energy_base.get(gpu, 0)
        if fid in self.capture.fields and scope == 0:
            return self.capture.fields[fid]
        return self._nvlink_field(fid, scope)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._index(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in zip(values, field_ids, strict=True):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            slot.fieldId, slot.scopeId = fid, scope
            answer = self._field(fid, scope, gpu)
            if answer is None:  # what the card does with the 206 of 269 fields it did not answer
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            kind, value = answer
            slot.nvmlReturn, slot.valueType = pynvml.NVML_SUCCESS, kind
            if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
                slot.value.dVal = float(value)
            elif kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                slot.value.uiVal = int(value)
            else:
                slot.value.ullVal = int(value)
        self.advance_pcie(*self.pcie_step)
        return values

    # --- NVLink ----------------------------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        if self.nvlinks:
            if link >= self.nvlinks:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return int(pynvml.NVML_FEATURE_ENABLED)
        captured = self.capture.device["nvlink"].get(str(link))
        if captured is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        raise pynvml.NVMLError(error_code(captured["state_error"]))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self.nvmlDeviceGetNvLinkState(handle, link)
        return 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        self.nvmlDeviceGetNvLinkState(handle, link)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)  # an HGX H200 board: every link goes to an NVSwitch

    # --- processes -------------------------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        self._index(handle)
        if self.mig and not self.privileged:  # "aggregate information only if the caller has the privileges"
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        procs = []
        for pid, used, _sm, _mem in self.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.gpuInstanceId, info.computeInstanceId = pid, NO_INSTANCE, NO_INSTANCE
            info.usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            obj = pynvml.nvmlStructToFriendlyObject(info)
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None  # what pynvml's wrapper does
            procs.append(obj)
        return procs

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, time_stamp: int) -> list[Any]:
        samples = []
        for stamp, (pid, _used, sm, mem) in enumerate(self.processes, start=1_000_000):
            if stamp <= time_stamp:
                continue
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = pid, stamp, sm, mem
            samples.append(sample)
        if not samples:
            _value(self.capture.device["proc_util"])  # the capture: NotFound when no process ran
        return samples

    # --- MIG -------------------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [1, 1] if self.mig else [int(mode) for mode in self._dev("mig_mode")]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7 if self.mig else int(self._dev("mig_max"))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        captured = self.capture.gi_profiles.get(profile, pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if isinstance(captured, int):
            raise pynvml.NVMLError(captured)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        for name, _ in info._fields_:
            if name in captured and name != "possible_placements":
                value = captured[name]
                setattr(info, name, value.encode() if isinstance(value, str) else value)
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        placements = self.capture.placements.get(profile_id)
        if placements is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        count = _out(count_ref)
        if placements_ref is None:  # size query
            count.value = len(placements)
            return int(pynvml.NVML_SUCCESS)
        if count.value < len(placements):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, (start, size) in zip(placements_ref, placements, strict=False):
            slot.start, slot.size = start, size
        count.value = len(placements)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstances(self, device: Any, profile_id: int, instances_ref: Any, count_ref: Any) -> int:
        if not self.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_STATE)
        if profile_id not in self.capture.placements:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _out(count_ref).value = 0  # the capture has no GPU instances
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND if self.mig else pynvml.NVML_ERROR_INVALID_STATE)

    # --- events ----------------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        address = self._next_set
        self._next_set += 0x10
        self._sets[address] = _EventSet()
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlEventSet_t)

    def _set(self, event_set: Any) -> _EventSet:
        found = self._sets.get(ctypes.cast(event_set, ctypes.c_void_p).value or 0)
        if found is None:  # freed or never made: a caller bug the tests must see
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._set(event_set)
        del self._sets[ctypes.cast(event_set, ctypes.c_void_p).value or 0]

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._index(handle)
        return int(self._dev("supported_events"))

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._index(handle)
        self._set(event_set).registered[gpu] = (int(event_types), self.resets.get(gpu, 0))

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> Any:
        live = self._set(event_set)
        if not live.queue:
            if any(gpu in self.lost for gpu in live.registered):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            # the capture: "Timeout after 200 ms" (the fake answers at once)
            raise pynvml.NVMLError(error_code(self.capture.device["event_wait"].split(" after")[0]))
        gpu, event_type, data, gi, ci = live.queue.pop(0)
        event = pynvml.c_nvmlEventData_t()
        event.device, event.eventType, event.eventData = self.handles[gpu], event_type, data
        event.gpuInstanceId, event.computeInstanceId = gi, ci
        return event

    # --- GPM, codec utilization, PCIe throughput (modelled: see GpmModel) --------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        self._index(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version, support.isSupportedDevice = pynvml.NVML_GPM_SUPPORT_VERSION, int(self.gpm.supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        return self.gpm.alloc()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.gpm.free(sample)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if not self.gpm.supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.gpm.take((self._index(handle), -1), sample)
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        key = (self._index(handle), gpu_instance_id)
        if not self.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_STATE)
        if key not in self.gpm.activity:  # a GPU instance exists in the model once a test sets its activity
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        self.gpm.take(key, sample)
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        return self.gpm.metrics(metrics_get)

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return [int(v) for v in self._dev("enc_util")]  # captured: [0 %, 100000 us sampling period]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return [int(v) for v in self._dev("enc_util")]  # modelled: nvidia-smi -q says Decoder 0 %, as the encoder

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        self._index(handle)
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return int(self._dev("pcie_tx_kbs"))
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return GPM_PCIE_RX_KBS
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@dataclass
class _EventSet:
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)  # gpu -> (event mask, resets at the time)
    queue: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # gpu, type, data, gi, ci


MODELLED_CALLS: tuple[str, ...] = tuple(
    name for name in vars(FakeNvml) if name.startswith("nvml") and callable(getattr(FakeNvml, name))
)


def install(
    monkeypatch: pytest.MonkeyPatch, *, nvlinks: int = 0, mig: bool = False, count: int = 1, privileged: bool = True
) -> FakeNvml:
    """Patch the pynvml functions NvmlBackend calls with answers from the capture; returns the fake's state.

    ``nvlinks=0``, ``mig=False``, ``count=1`` is the captured card as it was. ``nvlinks=N`` models N NVLinks up
    (an HGX board), ``mig=True`` MIG mode on with no instances, ``count`` more copies of the captured card,
    ``privileged=False`` a caller without the privileges NVML wants for a MIG card's process list.
    """
    state = FakeNvml(load_capture(), count=count, nvlinks=nvlinks, mig=mig, privileged=privileged)
    for name in MODELLED_CALLS:
        monkeypatch.setattr(pynvml, name, state._guard(name, getattr(state, name)))
    return state
