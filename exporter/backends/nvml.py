"""The real backend: NVML through pynvml (nvidia-ml-py).

NVML error codes are translated here, once: NotSupported / FunctionNotFound on an optional reading become
``UNSUPPORTED``; everything else becomes one of the exceptions in ``errors.py`` with ``call`` set to the NVML
function that failed. The per-cycle path (:meth:`NvmlBackend.sample`) reads counters through one
``nvmlDeviceGetFieldValues`` batch plus cheap direct calls and never calls the sampling-window functions
(``nvmlDeviceGetPcieThroughput`` 20 ms, ``nvmlDeviceGetTotalEnergyConsumption`` 4.5 ms) or
``nvmlDeviceGetMaxClockInfo`` (1.4 ms, read once in :meth:`NvmlBackend.device_info`).

Per-card state (handle, identity with the minor number, NVLink list, field request, MIG profiles) is cached and
renewed when ``nvml_cards.CardWatch`` finds it stale: a MIG mode change, a handle NVML rejects, a card back from
GPU_IS_LOST / RESET_REQUIRED or reset between samples. The event set (``nvml_events.py``) is rebuilt then too. A
process list NVML refuses (NO_PERMISSION: a MIG card's parent list without privileges) is ``UNKNOWN``.

Thread safety: NVML is thread-safe; the sampler calls per-device methods from one thread per GPU and
:meth:`NvmlBackend.wait_event` from its own thread. Shared caches are guarded by one lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import pynvml
import structlog

from exporter.backends.errors import (
    BackendError,
    DriverUnavailableError,
    GpuLostError,
    InsufficientResourcesError,
    InUseError,
    InvalidStateError,
    NotFoundError,
    ResetRequiredError,
    VersionMismatchError,
)
from exporter.backends.nvml_cards import CardWatch, Refresh, per_card
from exporter.backends.nvml_events import EventSet, handle_key
from exporter.backends.nvml_profiling import NvmlProfiling
from exporter.backends.types import (
    UNKNOWN,
    UNSUPPORTED,
    ComputeMode,
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    EccCounts,
    GpuProcess,
    LinkState,
    MigInstance,
    MigProfile,
    NvLinkSample,
    PcieThroughput,
    RemappedRows,
    SystemInfo,
    Unknown,
    Unsupported,
)

T = TypeVar("T")
log = structlog.get_logger("nvml")

_MIB: Final = 1024 * 1024
_KIB: Final = 1024
_INVALID_ID: Final = 0xFFFFFFFF  # NVML's "no GPU instance" / "not available" for 32-bit ids
_PSTATE_UNKNOWN: Final = 32
_MAX_PLACEMENTS: Final = 64  # more than any card's memory-slice count

# Readings a card may simply not have: these become UNSUPPORTED, never exceptions.
_UNSUPPORTED_CODES: Final = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# Returned by profile/link enumerations past the last valid entry.
_SKIP_CODES: Final = _UNSUPPORTED_CODES | {pynvml.NVML_ERROR_INVALID_ARGUMENT}
# The library itself is not usable (raised by any call, not just nvmlInit).
_DRIVER_CODES: Final = frozenset(
    {pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_UNINITIALIZED}
)
_ERROR_CLASSES: Final[Mapping[int, type[BackendError]]] = {
    pynvml.NVML_ERROR_GPU_IS_LOST: GpuLostError,
    pynvml.NVML_ERROR_RESET_REQUIRED: ResetRequiredError,
    pynvml.NVML_ERROR_NOT_FOUND: NotFoundError,
    pynvml.NVML_ERROR_IN_USE: InUseError,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResourcesError,
    pynvml.NVML_ERROR_INVALID_STATE: InvalidStateError,
}

# nvmlFieldValue_t.valueType -> the nvmlValue_t union member holding the value.
_VALUE_MEMBERS: Final[Mapping[int, str]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

FieldKey = tuple[int, int]  # (fieldId, scopeId)

_FI_ECC_CURRENT: Final = pynvml.NVML_FI_DEV_ECC_CURRENT
_FI_ECC_PENDING: Final = pynvml.NVML_FI_DEV_ECC_PENDING
_FI_SBE_VOL: Final = pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL
_FI_DBE_VOL: Final = pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL
_FI_SBE_AGG: Final = pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL
_FI_DBE_AGG: Final = pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL
_FI_MEMORY_TEMP: Final = pynvml.NVML_FI_DEV_MEMORY_TEMP
_FI_ENERGY: Final = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION  # mJ since driver load
_FI_PCIE_REPLAY: Final = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER
_FI_REMAP_COR: Final = pynvml.NVML_FI_DEV_REMAPPED_COR
_FI_REMAP_UNC: Final = pynvml.NVML_FI_DEV_REMAPPED_UNC
_FI_REMAP_PENDING: Final = pynvml.NVML_FI_DEV_REMAPPED_PENDING
_FI_REMAP_FAILURE: Final = pynvml.NVML_FI_DEV_REMAPPED_FAILURE
_FI_RECOVERY_ACTION: Final = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
# NVLink throughput counters take the link in scopeId (nvml.h); values are KiB.
_FI_NVLINK_TX: Final = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
_FI_NVLINK_RX: Final = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

_DEVICE_FIELDS: Final[tuple[int, ...]] = (
    _FI_ECC_CURRENT,
    _FI_ECC_PENDING,
    _FI_SBE_VOL,
    _FI_DBE_VOL,
    _FI_SBE_AGG,
    _FI_DBE_AGG,
    _FI_MEMORY_TEMP,
    _FI_ENERGY,
    _FI_PCIE_REPLAY,
    _FI_REMAP_COR,
    _FI_REMAP_UNC,
    _FI_REMAP_PENDING,
    _FI_REMAP_FAILURE,
    _FI_RECOVERY_ACTION,
)


def _per_link_ids(kind: str) -> tuple[int, ...]:
    """Field IDs of a per-link NVLink error counter for links 0..11 (NVML defines no per-link IDs past 11)."""
    ids = []
    for link in range(12):
        value = getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}", None)
        if value is None:
            break
        ids.append(int(value))
    return tuple(ids)


_FI_LINK_CRC_FLIT: Final = _per_link_ids("CRC_FLIT")
_FI_LINK_CRC_DATA: Final = _per_link_ids("CRC_DATA")
_FI_LINK_REPLAY: Final = _per_link_ids("REPLAY")
_FI_LINK_RECOVERY: Final = _per_link_ids("RECOVERY")


# --- error translation and optional readings -------------------------------------------------------------------


def _error_code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _translate(err: BaseException, call: str, *, init: bool = False) -> BackendError:
    """Map one ``pynvml.NVMLError`` to the backend's exceptions; ``init`` widens what counts as "no driver"."""
    code = _error_code(err)
    message = f"{call} failed: {type(err).__name__} (NVML return {code})"
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return VersionMismatchError(message, call=call)
    if code in _DRIVER_CODES or (init and code == pynvml.NVML_ERROR_NO_PERMISSION):
        return DriverUnavailableError(message, call=call)
    return _ERROR_CLASSES.get(code if code is not None else -1, BackendError)(message, call=call)


def _call(call: str, fn: Callable[..., T], *args: Any) -> T:
    """Run one NVML call; any NVML error leaves as a translated exception naming ``call``."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        raise _translate(err, call) from err


def _optional(call: str, fn: Callable[..., T], *args: Any) -> T | Unsupported:
    """Like :func:`_call`, but NotSupported / FunctionNotFound return ``UNSUPPORTED``."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        if _error_code(err) in _UNSUPPORTED_CODES:
            return UNSUPPORTED
        raise _translate(err, call) from err


def _skippable(call: str, fn: Callable[..., T], *args: Any) -> T | None:
    """For enumerations: None where NVML answers NotSupported / InvalidArgument (an unused profile or link slot)."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        if _error_code(err) in _SKIP_CODES:
            return None
        raise _translate(err, call) from err


# --- field values ----------------------------------------------------------------------------------------------


def _decode_field(fv: Any) -> int | float | Unsupported:
    """The value of one ``c_nvmlFieldValue_t``: UNSUPPORTED unless its own nvmlReturn is SUCCESS."""
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return UNSUPPORTED
    member = _VALUE_MEMBERS.get(int(fv.valueType))
    if member is None:
        return UNSUPPORTED
    value = getattr(fv.value, member)
    return float(value) if member == "dVal" else int(value)


# --- small conversions -----------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _as_int(value: Any) -> int | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else int(value)


def _as_bool(value: Any) -> bool | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else bool(value)


def _scaled(value: Any, factor: float) -> float | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else float(value) * factor


def _profile_name(raw: Any, slices: int, memory_mib: int) -> str:
    """``"MIG 1g.18gb"`` -> ``"1g.18gb"``; synthesised like DCGM when the driver gives no name (v1 struct)."""
    name = _text(raw).strip() if raw else ""
    if not name:
        return f"{slices}g.{(memory_mib + 1023) // 1024}gb"
    return name.removeprefix("MIG ").strip()


def _takes_out_refs(fn: Callable[..., Any], plain_arity: int) -> bool:
    """True when a pynvml list wrapper wants caller-allocated (array, count) arguments.

    nvidia-ml-py 12.x/13.x declare e.g. ``nvmlDeviceGetGpuInstancePossiblePlacements(device, profileId,
    placementsRef, countRef)``; other builds return a Python list from ``(device, profileId)``.
    """
    try:
        return len(inspect.signature(fn).parameters) > plain_arity
    except (TypeError, ValueError):
        return True


def _list_call(call: str, fn: Callable[..., Any], item_type: Any, capacity: int, *args: Any) -> list[Any]:
    """Call a pynvml enumeration in whichever signature the installed wrapper has; NotSupported is empty."""
    if not _takes_out_refs(fn, len(args)):
        listed = _optional(call, fn, *args)
        return [] if isinstance(listed, Unsupported) else list(listed)
    count = ctypes.c_uint(capacity)
    items = (item_type * capacity)()
    if _optional(call, fn, *args, items, ctypes.byref(count)) is UNSUPPORTED:
        return []
    return list(items[: min(count.value, capacity)])


class NvmlBackend:
    """The Backend protocol on real NVIDIA GPUs."""

    name = "nvml"

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        event_retry_seconds: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root  # kept for callers that resolve PIDs; NVML reports host PIDs
        self._lock = threading.Lock()
        self._open = False
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._infos: dict[int, DeviceInfo] = {}
        self._links: dict[int, tuple[int, ...]] = {}
        self._field_requests: dict[int, tuple[FieldKey, ...]] = {}
        self._profiles: dict[int, tuple[MigProfile, ...]] = {}
        self._util_seen: dict[int, int] = {}  # gpu -> last process-utilization timestamp (us)
        self._cards = CardWatch()
        self.call_nesting = threading.local()  # per-card calls made inside another are not watched twice
        self._event_set = EventSet(
            count=lambda: self._count,
            handle=self._handle,
            uuid=lambda index: self.device_info(index).uuid,
            call=_call,
            optional=_optional,
            translate=_translate,
            retry_seconds=event_retry_seconds,  # how often a card that could not be registered is tried again
        )
        self._profiling = NvmlProfiling(_translate, monotonic)  # GPM samples per card and MIG instance

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._open:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise _translate(err, "nvmlInit", init=True) from err
            try:
                self._count = int(pynvml.nvmlDeviceGetCount())
            except pynvml.NVMLError as err:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()
                raise _translate(err, "nvmlDeviceGetCount", init=True) from err
            self._open = True

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
            self._event_set.close()
            self._cards.forget()
            for cache in (self._handles, self._infos, self._links, self._field_requests, self._profiles):
                cache.clear()
            self._util_seen.clear()
            self._profiling.forget()
            self._count = 0
            with contextlib.suppress(pynvml.NVMLError):  # already shut down or driver gone: nothing left to release
                pynvml.nvmlShutdown()

    # --- system and identity ---------------------------------------------------------------------------------

    def system_info(self) -> SystemInfo:
        self._require_open()
        cuda = _optional("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2)
        if cuda is UNSUPPORTED:
            cuda = _optional("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        return SystemInfo(
            driver_version=_text(_call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)),
            nvml_version=_text(_call("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion)),
            cuda_driver_version=_as_int(cuda),
            backend=self.name,
        )

    def device_count(self) -> int:
        self._require_open()
        return self._count

    @per_card
    def device_info(self, index: int) -> DeviceInfo:
        cached = self._infos.get(index)
        if cached is not None:
            return cached
        h = self._handle(index)
        pci = _call("nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3, h)
        memory = _call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        links = self._probe_links(h)
        cc = _optional("nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, h)
        serial = _optional("nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, h)
        vbios = _optional("nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, h)
        info = DeviceInfo(
            index=index,
            uuid=_text(_call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h)),
            name=_text(_call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h)),
            pci_bus_id=_text(pci.busId).upper(),
            serial=UNSUPPORTED if serial is UNSUPPORTED else _text(serial),
            minor_number=_as_int(_optional("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, h)),
            memory_total_bytes=int(memory.total),
            sm_clock_max_mhz=_as_int(
                _optional("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
            ),
            memory_clock_max_mhz=_as_int(
                _optional("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
            ),
            pcie_generation_max=_as_int(
                _optional("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
            ),
            pcie_width_max=_as_int(_optional("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
            power_limit_default_mw=_as_int(
                _optional(
                    "nvmlDeviceGetPowerManagementDefaultLimit", pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h
                )
            ),
            nvlink_count=len(links),
            mig_capable=_optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h) is not UNSUPPORTED,
            compute_capability=UNSUPPORTED if cc is UNSUPPORTED else (int(cc[0]), int(cc[1])),
            vbios_version=UNSUPPORTED if vbios is UNSUPPORTED else _text(vbios),
        )
        with self._lock:
            self._links[index] = links
            return self._infos.setdefault(index, info)

    def _probe_links(self, h: Any) -> tuple[int, ...]:
        """Links whose state NVML answers; none when link 0 is NotSupported (e.g. a PCIe card or a VM)."""
        links: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError as err:
                code = _error_code(err)
                if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                    break  # past the card's last link
                if code in _UNSUPPORTED_CODES:
                    if link == 0:
                        break
                    continue
                raise _translate(err, "nvmlDeviceGetNvLinkState") from err
            links.append(link)
        return tuple(links)

    @per_card
    def nvlink_peers(self, index: int) -> tuple[str, ...] | Unsupported:
        """Per active link: the remote GPU's PCI bus id, or "nvswitch" (nvmlDeviceGetNvLinkRemoteDeviceType SWITCH;
        on NVSwitch systems the remote PCI info names the switch, not a GPU)."""
        h = self._handle(index)
        self.device_info(index)  # fills self._links
        links = self._links.get(index, ())
        if not links:
            return UNSUPPORTED
        peers: list[str] = []
        for link in links:
            state = _optional("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
            if state is UNSUPPORTED or int(state) != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = _optional("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if kind is not UNSUPPORTED and int(kind) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                peers.append("nvswitch")
                continue
            pci = _optional("nvmlDeviceGetNvLinkRemotePciInfo", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            if pci is not UNSUPPORTED:
                peers.append(_text(pci.busId).upper())
        return tuple(peers)

    # --- the hot path ------------------------------------------------------------------------------------------

    @per_card
    def sample(self, index: int) -> DeviceSample:
        h = self._handle(index)
        info = self.device_info(index)
        fields = self._read_fields(index, h)

        def field(fid: int) -> int | float | Unsupported:
            return fields.get((fid, 0), UNSUPPORTED)

        used, free, reserved = self._memory(h)
        util = _optional("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, h)
        reasons = _optional("nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is UNSUPPORTED:  # drivers before 535 only have the old name
            reasons = _optional(
                "nvmlDeviceGetCurrentClocksThrottleReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h
            )
        pstate = _as_int(_optional("nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, h))
        compute_mode = _optional("nvmlDeviceGetComputeMode", pynvml.nvmlDeviceGetComputeMode, h)
        mig = _optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)
        return DeviceSample(
            gpu_utilization_ratio=UNSUPPORTED if util is UNSUPPORTED else _ratio(util.gpu),
            memory_utilization_ratio=UNSUPPORTED if util is UNSUPPORTED else _ratio(util.memory),
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            temperature_gpu_celsius=_scaled(
                _optional("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                1.0,
            ),
            temperature_memory_celsius=_scaled(field(_FI_MEMORY_TEMP), 1.0),
            power_draw_watts=_scaled(_optional("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h), 1e-3),
            power_limit_watts=_scaled(
                _optional("nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3
            ),
            energy_joules=_scaled(field(_FI_ENERGY), 1e-3),
            sm_clock_mhz=_as_int(
                _optional("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
            ),
            memory_clock_mhz=_as_int(
                _optional("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
            ),
            clock_event_reasons=_as_int(reasons),
            performance_state=UNSUPPORTED if pstate == _PSTATE_UNKNOWN else pstate,
            pcie_generation=_as_int(
                _optional("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
            ),
            pcie_width=_as_int(_optional("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
            pcie_replay_count=_as_int(field(_FI_PCIE_REPLAY)),
            ecc=EccCounts(
                enabled_current=_as_bool(field(_FI_ECC_CURRENT)),
                enabled_pending=_as_bool(field(_FI_ECC_PENDING)),
                corrected_volatile=_as_int(field(_FI_SBE_VOL)),
                uncorrected_volatile=_as_int(field(_FI_DBE_VOL)),
                corrected_aggregate=_as_int(field(_FI_SBE_AGG)),
                uncorrected_aggregate=_as_int(field(_FI_DBE_AGG)),
            ),
            remapped_rows=self._remapped_rows(h, field),
            recovery_action=_as_int(field(_FI_RECOVERY_ACTION)),
            nvlinks=self._nvlinks(index, h, fields) if info.nvlink_count else UNSUPPORTED,
            compute_mode=UNSUPPORTED if compute_mode is UNSUPPORTED else ComputeMode(int(compute_mode)),
            persistence_mode=_as_bool(
                _optional("nvmlDeviceGetPersistenceMode", pynvml.nvmlDeviceGetPersistenceMode, h)
            ),
            mig_mode_current=UNSUPPORTED if mig is UNSUPPORTED else bool(mig[0]),
            mig_mode_pending=UNSUPPORTED if mig is UNSUPPORTED else bool(mig[1]),
        )

    def _field_request(self, index: int) -> tuple[FieldKey, ...]:
        request = self._field_requests.get(index)
        if request is None:
            keys: list[FieldKey] = [(fid, 0) for fid in _DEVICE_FIELDS]
            for link in self._links.get(index, ()):
                keys += [(_FI_NVLINK_TX, link), (_FI_NVLINK_RX, link)]
                if link < len(_FI_LINK_CRC_FLIT):
                    keys += [
                        (_FI_LINK_CRC_FLIT[link], 0),
                        (_FI_LINK_CRC_DATA[link], 0),
                        (_FI_LINK_REPLAY[link], 0),
                        (_FI_LINK_RECOVERY[link], 0),
                    ]
            request = self._field_requests.setdefault(index, tuple(keys))
        return request

    def _read_fields(self, index: int, h: Any) -> dict[FieldKey, int | float | Unsupported]:
        """One ``nvmlDeviceGetFieldValues`` batch; fields the card does not answer are left out."""
        request = self._field_request(index)
        values = _optional("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, h, list(request))
        if values is UNSUPPORTED:
            return {}
        out: dict[FieldKey, int | float | Unsupported] = {}
        for key, fv in zip(request, values, strict=True):
            value = _decode_field(fv)
            if value is UNSUPPORTED:
                continue
            out[key] = value  # raw: a counter that goes down was reset (driver reload), which Prometheus handles
        return out

    def _memory(self, h: Any) -> tuple[int, int, int | Unsupported]:
        """(used, free, reserved): v2 splits out driver-reserved memory; v1 folds it into used."""
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
            return int(mem.used), int(mem.free), int(mem.reserved)
        except pynvml.NVMLError as err:
            fallback = _UNSUPPORTED_CODES | {pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
            if _error_code(err) not in fallback:
                raise _translate(err, "nvmlDeviceGetMemoryInfo_v2") from err
        mem = _call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        return int(mem.used), int(mem.free), UNSUPPORTED

    def _remapped_rows(self, h: Any, field: Callable[[int], int | float | Unsupported]) -> RemappedRows | Unsupported:
        parts = [field(fid) for fid in (_FI_REMAP_COR, _FI_REMAP_UNC, _FI_REMAP_PENDING, _FI_REMAP_FAILURE)]
        values: list[int] = [int(part) for part in parts if not isinstance(part, Unsupported)]
        if len(values) != len(parts):
            rows = _optional("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
            if rows is UNSUPPORTED:
                return UNSUPPORTED
            values = [int(part) for part in rows]
        cor, unc, pending, failure = values
        return RemappedRows(correctable=cor, uncorrectable=unc, pending=bool(pending), failure=bool(failure))

    def _nvlinks(
        self, index: int, h: Any, fields: Mapping[FieldKey, int | float | Unsupported]
    ) -> tuple[NvLinkSample, ...]:
        samples = []
        for link in self._links.get(index, ()):
            state = _optional("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
            if state is UNSUPPORTED:
                continue
            if link < len(_FI_LINK_CRC_FLIT):
                flit = fields.get((_FI_LINK_CRC_FLIT[link], 0), UNSUPPORTED)
                data = fields.get((_FI_LINK_CRC_DATA[link], 0), UNSUPPORTED)
                replay = fields.get((_FI_LINK_REPLAY[link], 0), UNSUPPORTED)
                recovery = fields.get((_FI_LINK_RECOVERY[link], 0), UNSUPPORTED)
            else:
                flit = data = replay = recovery = UNSUPPORTED
            # Links past 11 have no per-link field IDs; a driver may also refuse them. Ask the error-counter call.
            if flit is UNSUPPORTED and data is UNSUPPORTED:
                flit = self._link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
                data = self._link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
            if replay is UNSUPPORTED:
                replay = self._link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
            if recovery is UNSUPPORTED:
                recovery = self._link_error(h, link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
            crc = [part for part in (flit, data) if part is not UNSUPPORTED]
            samples.append(
                NvLinkSample(
                    link=link,
                    state=LinkState.UP if state else LinkState.DOWN,
                    crc_errors=sum(int(part) for part in crc) if crc else UNSUPPORTED,
                    replay_errors=_as_int(replay),
                    recovery_errors=_as_int(recovery),
                    tx_bytes=_as_int(_scaled(fields.get((_FI_NVLINK_TX, link), UNSUPPORTED), _KIB)),
                    rx_bytes=_as_int(_scaled(fields.get((_FI_NVLINK_RX, link), UNSUPPORTED), _KIB)),
                )
            )
        return tuple(samples)

    @staticmethod
    def _link_error(h: Any, link: int, counter: int) -> int | Unsupported:
        return _as_int(
            _optional("nvmlDeviceGetNvLinkErrorCounter", pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
        )

    # --- profiling (GPM) and PCIe throughput: nvml_profiling.py --------------------------------------------------

    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        return self._profiling.read(index, self._handle(index), mig_instances)

    def pcie_throughput(self, index: int) -> PcieThroughput:
        return self._profiling.pcie_throughput(self._handle(index))

    # --- processes ---------------------------------------------------------------------------------------------

    @per_card
    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unknown:
        h = self._handle(index)
        running = _running_processes(h)
        if isinstance(running, Unknown):
            return UNKNOWN
        if isinstance(running, Unsupported) or not running:
            return ()
        sm_util = self._process_sm_util(index, h)
        by_pid: dict[int, GpuProcess] = {}
        for proc in running:
            pid = int(proc.pid)
            used = proc.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE
            gi = getattr(proc, "gpuInstanceId", None)
            entry = GpuProcess(
                pid=pid,
                used_memory_bytes=UNSUPPORTED if used is None else int(used),
                sm_utilization_ratio=sm_util.get(pid, UNSUPPORTED),
                gpu_instance_id=UNSUPPORTED if gi is None or int(gi) == _INVALID_ID else int(gi),
            )
            previous = by_pid.get(pid)
            if previous is not None:
                # Listed twice (e.g. once per MIG compute instance): one entry, memory added up where known.
                a, b = previous.used_memory_bytes, entry.used_memory_bytes
                memory = b if isinstance(a, Unsupported) else a if isinstance(b, Unsupported) else a + b
                entry = dataclasses.replace(previous, used_memory_bytes=memory)
            by_pid[pid] = entry
        return tuple(by_pid.values())

    def _process_sm_util(self, index: int, h: Any) -> dict[int, float]:
        """SM use per PID from samples newer than the last call's (2.9 ms: once per cycle, only with processes)."""
        call = "nvmlDeviceGetProcessUtilization"
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, self._util_seen.get(index, 0))
        except pynvml.NVMLError as err:
            # NotFound: no samples since the timestamp. pynvml raises NVMLError(SUCCESS) for an empty buffer.
            if _error_code(err) in _UNSUPPORTED_CODES | {pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS}:
                return {}
            raise _translate(err, call) from err
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            stamp, pid = int(s.timeStamp), int(s.pid)
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, int(s.smUtil))
        if latest:
            self._util_seen[index] = max(stamp for stamp, _ in latest.values())
        return {pid: _ratio(sm) for pid, (_, sm) in latest.items()}

    # --- MIG ---------------------------------------------------------------------------------------------------

    @per_card
    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        cached = self._profiles.get(index)
        if cached is not None:
            return cached
        h = self._handle(index)
        profiles: list[MigProfile] = []
        seen: set[int] = set()
        for const in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._gi_profile_info(h, const)
            if info is None or int(info.id) in seen:
                continue
            seen.add(int(info.id))
            memory_mib = int(info.memorySizeMB)
            slices = int(info.sliceCount)
            placements = _list_call(
                "nvmlDeviceGetGpuInstancePossiblePlacements",
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
                pynvml.c_nvmlGpuInstancePlacement_t,
                _MAX_PLACEMENTS,
                h,
                int(info.id),
            )
            profiles.append(
                MigProfile(
                    profile_id=int(info.id),
                    name=_profile_name(getattr(info, "name", ""), slices, memory_mib),
                    slice_count=slices,
                    memory_mib=memory_mib,
                    sm_count=int(info.multiprocessorCount),
                    instance_count=int(info.instanceCount),
                    placements=tuple((int(p.start), int(p.size)) for p in placements),
                )
            )
        with self._lock:
            return self._profiles.setdefault(index, tuple(profiles))

    @staticmethod
    def _gi_profile_info(h: Any, const: int) -> Any:
        """Profile info by profile constant (v2 carries the name); None for constants this card lacks."""
        call = "nvmlDeviceGetGpuInstanceProfileInfo"
        try:
            return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
        except pynvml.NVMLError as err:
            if _error_code(err) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                if _error_code(err) in _SKIP_CODES:
                    return None
                raise _translate(err, call) from err
        return _skippable(call, pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const, 1)

    @per_card
    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        h = self._handle(index)
        if not self._mig_enabled(h):
            return ()
        profiles = {p.profile_id: p for p in self.mig_profiles(index)}
        gpu_instances: dict[int, tuple[MigProfile, int, int]] = {}  # gi id -> (profile, start, size)
        for profile in profiles.values():
            for gi in self._gpu_instances(h, profile):
                gi_info = _call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
                placement = gi_info.placement
                gpu_instances[int(gi_info.id)] = (profile, int(placement.start), int(placement.size))
        if not gpu_instances:
            return ()
        result: list[MigInstance] = []
        slots = int(_call("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h))
        for slot in range(slots):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except pynvml.NVMLError as err:
                if _error_code(err) in _SKIP_CODES | {pynvml.NVML_ERROR_NOT_FOUND}:
                    continue  # empty slot
                raise _translate(err, "nvmlDeviceGetMigDeviceHandleByIndex") from err
            gi_id = int(_call("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig))
            if gi_id not in gpu_instances:
                continue  # created after the walk above; the next call sees it
            profile, start, size = gpu_instances[gi_id]
            memory = _optional("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, mig)
            attrs = _optional("nvmlDeviceGetAttributes", pynvml.nvmlDeviceGetAttributes, mig)
            result.append(
                MigInstance(
                    parent_index=index,
                    gpu_instance_id=gi_id,
                    compute_instance_id=int(
                        _call("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig)
                    ),
                    profile_id=profile.profile_id,
                    profile_name=profile.name,
                    placement_start=start,
                    placement_size=size,
                    uuid=_text(_call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig)),
                    sm_count=profile.sm_count if attrs is UNSUPPORTED else int(attrs.multiprocessorCount),
                    memory_total_bytes=profile.memory_mib * _MIB if memory is UNSUPPORTED else int(memory.total),
                    memory_used_bytes=UNSUPPORTED if memory is UNSUPPORTED else int(memory.used),
                )
            )
        return tuple(sorted(result, key=lambda m: (m.gpu_instance_id, m.compute_instance_id)))

    @per_card
    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        h = self._handle(index)
        if not self._mig_enabled(h):
            raise InvalidStateError(f"MIG is not enabled on GPU {index}", call="nvmlDeviceGetMigMode")
        profile = next((p for p in self.mig_profiles(index) if p.profile_id == profile_id), None)
        if profile is None:
            raise NotFoundError(
                f"GPU {index} has no MIG profile {profile_id}", call="nvmlDeviceGetGpuInstanceProfileInfo"
            )
        size = next((size for start, size in profile.placements if start == placement_start), None)
        if size is None:
            raise NotFoundError(
                f"profile {profile.name} has no placement starting at memory slice {placement_start}",
                call="nvmlDeviceGetGpuInstancePossiblePlacements",
            )
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = placement_start, size
        gi = _call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(placement),
        )
        try:
            ci_profile = self._full_ci_profile(gi, profile.slice_count)
            _call("nvmlGpuInstanceCreateComputeInstance", pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile)
            gi_id = int(_call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi).id)
        except BackendError:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlGpuInstanceDestroy(gi)  # do not leave a GPU instance without a compute instance
            raise
        for instance in self.mig_instances(index):
            if instance.gpu_instance_id == gi_id:
                return instance
        raise BackendError(
            f"GPU instance {gi_id} was created on GPU {index} but no MIG device appeared",
            call="nvmlDeviceGetMigDeviceHandleByIndex",
        )

    @per_card
    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        h = self._handle(index)
        if not self._mig_enabled(h):
            raise InvalidStateError(f"MIG is not enabled on GPU {index}", call="nvmlDeviceGetMigMode")
        gi = _call("nvmlDeviceGetGpuInstanceById", pynvml.nvmlDeviceGetGpuInstanceById, h, gpu_instance_id)
        for ci in self._compute_instances(gi):
            _call("nvmlComputeInstanceDestroy", pynvml.nvmlComputeInstanceDestroy, ci)
        _call("nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, gi)

    @staticmethod
    def _mig_enabled(h: Any) -> bool:
        mode = _optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)
        return mode is not UNSUPPORTED and bool(mode[0])

    @staticmethod
    def _gpu_instances(h: Any, profile: MigProfile) -> list[Any]:
        return _list_call(
            "nvmlDeviceGetGpuInstances",
            pynvml.nvmlDeviceGetGpuInstances,
            pynvml.c_nvmlGpuInstance_t,
            max(profile.instance_count, 1),
            h,
            profile.profile_id,
        )

    @staticmethod
    def _ci_profiles(gi: Any) -> list[Any]:
        call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        infos = []
        for const in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = _skippable(
                call,
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                const,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            if info is not None:
                infos.append(info)
        return infos

    def _full_ci_profile(self, gi: Any, slices: int) -> int:
        """The compute-instance profile that spans the whole GPU instance."""
        infos = self._ci_profiles(gi)
        if not infos:
            raise NotFoundError(
                "GPU instance offers no compute-instance profile", call="nvmlGpuInstanceGetComputeInstanceProfileInfo"
            )
        exact = [info for info in infos if int(info.sliceCount) == slices]
        best = exact[0] if exact else max(infos, key=lambda info: int(info.sliceCount))
        return int(best.id)

    def _compute_instances(self, gi: Any) -> list[Any]:
        instances: list[Any] = []
        for info in self._ci_profiles(gi):
            instances += _list_call(
                "nvmlGpuInstanceGetComputeInstances",
                pynvml.nvmlGpuInstanceGetComputeInstances,
                pynvml.c_nvmlComputeInstance_t,
                max(int(info.instanceCount), 1),
                gi,
                int(info.id),
            )
        return instances

    # --- events ------------------------------------------------------------------------------------------------

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        """The next XID or ECC event of any card (nvml_events.py keeps the set registered across resets)."""
        self._require_open()
        return self._event_set.wait(timeout_s)

    # --- renewing a card's caches (nvml_cards.py decides when) -------------------------------------------------

    def watch_failure(self, index: int, err: BackendError) -> None:
        nvml_code = _error_code(err.__cause__) if err.__cause__ is not None else None
        rejected = nvml_code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)
        refresh = self._cards.failed(index, err.code, nvml_code, rejected)
        if refresh is not None:
            self._renew(index, refresh)

    def watch_answer(self, index: int, result: object) -> None:
        refresh = self._cards.answered(index, result) if isinstance(result, DeviceSample) else None
        if refresh is not None:
            self._renew(index, refresh)

    def _renew(self, index: int, refresh: Refresh) -> None:
        log.info(
            "renewing a card's NVML state",
            gpu=index,
            caches=refresh.caches,
            events=refresh.events,
            reason=refresh.reason,
        )
        if refresh.caches:
            with self._lock:
                for cache in (self._handles, self._infos, self._links, self._field_requests, self._profiles):
                    cache.pop(index, None)
                self._util_seen.pop(index, None)
        if refresh.events:
            self._event_set.rebuild(f"GPU {index}: {refresh.reason}")

    # --- plumbing ----------------------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._open:
            raise DriverUnavailableError("NVML is not initialised: call open() first", call="nvmlInit")

    def _handle(self, index: int) -> Any:
        """The device handle, cached by index; an index the node does not have is NotFoundError."""
        h = self._handles.get(index)
        if h is not None:
            return h
        self._require_open()
        if not 0 <= index < self._count:
            raise NotFoundError(
                f"no GPU with index {index} (node has {self._count})", call="nvmlDeviceGetHandleByIndex"
            )
        h = _call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
        with self._lock:
            h = self._handles.setdefault(index, h)
        refresh = self._cards.handle_taken(index, handle_key(h))
        if refresh is not None:
            self._renew(index, refresh)
        return h


def _running_processes(h: Any) -> list[Any] | Unsupported | Unknown:
    """The card's compute processes; UNKNOWN where NVML refuses the list (NO_PERMISSION: with MIG on the parent's
    list needs privileges) rather than failing the card's whole sample."""
    for call, fn in (
        ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.nvmlDeviceGetComputeRunningProcesses_v3),
        ("nvmlDeviceGetComputeRunningProcesses_v2", pynvml.nvmlDeviceGetComputeRunningProcesses_v2),  # before 510
    ):
        try:
            return list(fn(h))
        except pynvml.NVMLError as err:
            code = _error_code(err)
            if code == pynvml.NVML_ERROR_NO_PERMISSION:
                return UNKNOWN
            if code not in _UNSUPPORTED_CODES:
                raise _translate(err, call) from err
    return UNSUPPORTED


def _ratio(percent: Any) -> float:
    return min(max(float(percent) / 100.0, 0.0), 1.0)


__all__ = ["NvmlBackend"]
