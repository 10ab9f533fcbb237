"""A fake ``pynvml`` for :class:`exporter.backends.nvml.NvmlBackend`, answering from a real H200 capture.

The answers come from ``tests/fixtures/h200`` (``nvml-inventory.json`` and ``mig-probe.log``), measured on one
NVIDIA H200 SXM in a VM: no NVLink, MIG off, ECC on. :func:`install` monkeypatches every ``pynvml`` function the
backend calls; NVML errors are raised as ``pynvml.NVMLError(code)``, as the real wrappers do, and wherever the
capture says "Not Supported" the fake raises NotSupported (fan, NUMA node, retired pages, NVLink when
``nvlinks=0``). Readings the capture lacks are modelled and marked as such below.

Knobs on the returned :class:`FakeNvml`: ``fail(call, code)`` makes one NVML function fail, ``lose_gpu()`` makes
every device call answer GPU_IS_LOST, ``advance_pcie()`` moves the 32-bit PCIe byte counters, ``post_xid()`` queues
an XID event, ``add_captured_process()`` adds the process the MIG probe saw. ``calls`` counts every NVML call.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
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


@dataclass
class FakeNvml:
    """The state behind the patched pynvml functions; method names are the NVML calls they stand in for."""

    capture: Capture
    count: int = 1
    nvlinks: int = 0
    mig: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # NVML call -> return code it fails with
    lost: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    pcie_tx_bytes: int = 0  # true byte totals; NVML reports them modulo 2**32
    pcie_rx_bytes: int = 0
    pcie_step: tuple[int, int] = (0, 0)  # (tx, rx) bytes added after every nvmlDeviceGetFieldValues
    energy_mj: int = 0
    processes: list[tuple[int, int | None, int, int]] = field(default_factory=list)
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (gpu, event type, event data)
    initialised: bool = False

    def __post_init__(self) -> None:
        fields = self.capture.fields
        self.pcie_tx_bytes = int(fields[pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES][1])
        self.pcie_rx_bytes = int(fields[pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES][1])
        self.energy_mj = int(fields[pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION][1])
        self.handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 + 0x100 * i), pynvml.c_nvmlDevice_t) for i in range(self.count)
        ]
        self._event_set = ctypes.cast(ctypes.c_void_p(0x7700), pynvml.c_nvmlEventSet_t)

    # --- knobs for tests -------------------------------------------------------------------------------------

    def fail(self, call: str, code: int) -> None:
        """Make every later ``call`` raise ``NVMLError(code)`` (``nvmlDeviceGetMemoryInfo_v2``: the v2 form only)."""
        self.errors[call] = code

    def lose_gpu(self) -> None:
        """Every device call answers GPU_IS_LOST from now on, as NVML does after the card falls off the bus."""
        self.lost = True

    def advance_pcie(self, tx_bytes: int, rx_bytes: int) -> None:
        self.pcie_tx_bytes += tx_bytes
        self.pcie_rx_bytes += rx_bytes

    def post_xid(self, gpu: int, xid: int) -> None:
        self.events.append((gpu, pynvml.nvmlEventTypeXidCriticalError, xid))

    def add_captured_process(self) -> None:
        self.processes.append(CAPTURED_PROCESS)

    # --- plumbing --------------------------------------------------------------------------------------------

    def _guard(self, call: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)  # keeps the signature: NvmlBackend inspects it for out-reference arguments
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.calls[call] += 1
            if call in self.errors:
                raise pynvml.NVMLError(self.errors[call])
            if self.lost and call.startswith("nvmlDevice"):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return fn(*args, **kwargs)

        return guarded

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
        return int(self._dev("minor")) + self._index(handle)

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

    def _field(self, fid: int, scope: int) -> tuple[int, int | float] | None:
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, self.pcie_tx_bytes % U32_SPAN
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, self.pcie_rx_bytes % U32_SPAN
        if fid in (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_ENERGY):
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, self.energy_mj
        if fid in self.capture.fields and scope == 0:
            return self.capture.fields[fid]
        return self._nvlink_field(fid, scope)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        self._index(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in zip(values, field_ids, strict=True):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            slot.fieldId, slot.scopeId = fid, scope
            answer = self._field(fid, scope)
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
        return self._event_set

    def nvmlEventSetFree(self, event_set: Any) -> None:
        return None

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(self._dev("supported_events"))

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self._index(handle)

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> Any:
        if not self.events:  # the capture: "Timeout after 200 ms" (the fake answers at once)
            raise pynvml.NVMLError(error_code(self.capture.device["event_wait"].split(" after")[0]))
        gpu, event_type, data = self.events.pop(0)
        event = pynvml.c_nvmlEventData_t()
        event.device, event.eventType, event.eventData = self.handles[gpu], event_type, data
        event.gpuInstanceId = event.computeInstanceId = NO_INSTANCE
        return event


MODELLED_CALLS: tuple[str, ...] = tuple(
    name for name in vars(FakeNvml) if name.startswith("nvml") and callable(getattr(FakeNvml, name))
)


def install(monkeypatch: pytest.MonkeyPatch, *, nvlinks: int = 0, mig: bool = False, count: int = 1) -> FakeNvml:
    """Patch the pynvml functions NvmlBackend calls with answers from the capture; returns the fake's state.

    ``nvlinks=0``, ``mig=False``, ``count=1`` is the captured card as it was. ``nvlinks=N`` models N NVLinks up
    (an HGX board), ``mig=True`` MIG mode on with no instances, ``count`` more copies of the captured card.
    """
    state = FakeNvml(load_capture(), count=count, nvlinks=nvlinks, mig=mig)
    for name in MODELLED_CALLS:
        monkeypatch.setattr(pynvml, name, state._guard(name, getattr(state, name)))
    return state
