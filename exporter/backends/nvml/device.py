"""NvmlBackend: the Backend protocol on real NVIDIA GPUs, through pynvml (nvidia-ml-py).

The per-cycle path (:meth:`NvmlBackend.sample`) reads counters through one ``nvmlDeviceGetFieldValues`` batch
(``fields.py``) plus cheap direct calls and never calls the sampling-window functions (``nvmlDeviceGetPcieThroughput``
20 ms, ``nvmlDeviceGetTotalEnergyConsumption`` 4.5 ms) or ``nvmlDeviceGetMaxClockInfo`` (1.4 ms, read once in
:meth:`NvmlBackend.device_info`). Errors are translated once, in ``calls.py``.

Per-card state (handle, identity with the minor number, NVLink list, field request, MIG profiles) is cached and
renewed when ``cards.CardWatch`` finds it stale: a MIG mode change, a handle NVML rejects, a card back from
GPU_IS_LOST / RESET_REQUIRED or reset between samples. The event set (``events.py``) is rebuilt then too. The MIG
mode is read only when it may have changed (``migmode.py``). A
process list NVML refuses (NO_PERMISSION: a MIG card's parent list without privileges) is ``UNKNOWN``.

Thread safety: NVML is thread-safe; the device-access layer calls per-device methods from one lane per GPU and
:meth:`NvmlBackend.wait_event` from its own lane. Shared caches are guarded by one lock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Final

import pynvml
import structlog

import exporter.backends.nvml.fields as fields
import exporter.backends.nvml.mig as mig
from exporter.backends.errors import BackendError, DriverUnavailableError, NotFoundError
from exporter.backends.nvml.calls import (
    UNSUPPORTED_CODES,
    as_bool,
    as_int,
    call,
    error_code,
    optional,
    ratio,
    scaled,
    text,
    translate,
)
from exporter.backends.nvml.cards import CardWatch, Refresh, per_card
from exporter.backends.nvml.events import EventSet, handle_key
from exporter.backends.nvml.handles import DeviceHandle
from exporter.backends.nvml.migmode import MigModeCache
from exporter.backends.nvml.processes import ProcessReader
from exporter.backends.nvml.profiling import NvmlProfiling
from exporter.backends.protocol import FaultInjector
from exporter.backends.types import (
    UNSUPPORTED,
    ComputeMode,
    DeviceEvent,
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    EccCounts,
    GpuProcess,
    MigInstance,
    MigProfile,
    PcieThroughput,
    SystemInfo,
    Unknown,
    Unsupported,
)

log = structlog.get_logger("nvml")

_PSTATE_UNKNOWN: Final = 32


class NvmlBackend:
    """The Backend protocol on real NVIDIA GPUs."""

    name = "nvml"
    injector: FaultInjector | None = None  # real cards take no injected faults

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
        self._handles: dict[int, DeviceHandle] = {}
        self._infos: dict[int, DeviceInfo] = {}
        self._links: dict[int, tuple[int, ...]] = {}
        self._field_requests: dict[int, tuple[fields.FieldKey, ...]] = {}
        self._profiles: dict[int, tuple[MigProfile, ...]] = {}
        self._processes = ProcessReader()
        self._mig_modes = MigModeCache()  # read again only when the mode may have changed (migmode.py)
        self._cards = CardWatch()
        self.call_nesting = threading.local()  # per-card calls made inside another are not watched twice
        self._event_set = EventSet(
            count=lambda: self._count,
            handle=self._handle,
            uuid=lambda index: self.device_info(index).uuid,
            retry_seconds=event_retry_seconds,  # how often a card that could not be registered is tried again
        )
        self._profiling = NvmlProfiling(monotonic)  # GPM samples per card and MIG instance

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._open:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise translate(err, "nvmlInit", init=True) from err
            try:
                self._count = int(pynvml.nvmlDeviceGetCount())
            except pynvml.NVMLError as err:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()
                raise translate(err, "nvmlDeviceGetCount", init=True) from err
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
            self._processes.forget()
            self._mig_modes.forget()
            self._profiling.forget()
            self._count = 0
            with contextlib.suppress(pynvml.NVMLError):  # already shut down or driver gone: nothing left to release
                pynvml.nvmlShutdown()

    # --- system and identity ---------------------------------------------------------------------------------

    def system_info(self) -> SystemInfo:
        self._require_open()
        cuda = optional("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2)
        if cuda is UNSUPPORTED:
            cuda = optional("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        return SystemInfo(
            driver_version=text(call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)),
            nvml_version=text(call("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion)),
            cuda_driver_version=as_int(cuda),
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
        pci = call("nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3, h)
        memory = call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        links = self._probe_links(h)
        cc = optional("nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, h)
        serial = optional("nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, h)
        vbios = optional("nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, h)
        info = DeviceInfo(
            index=index,
            uuid=text(call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h)),
            name=text(call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h)),
            pci_bus_id=text(pci.busId).upper(),
            serial=UNSUPPORTED if serial is UNSUPPORTED else text(serial),
            minor_number=as_int(optional("nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, h)),
            memory_total_bytes=int(memory.total),
            sm_clock_max_mhz=as_int(
                optional("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
            ),
            memory_clock_max_mhz=as_int(
                optional("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
            ),
            pcie_generation_max=as_int(
                optional("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
            ),
            pcie_width_max=as_int(optional("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
            power_limit_default_mw=as_int(
                optional("nvmlDeviceGetPowerManagementDefaultLimit", pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
            ),
            nvlink_count=len(links),
            mig_capable=not isinstance(self._mig_modes.read(index, h), Unsupported),
            compute_capability=UNSUPPORTED if cc is UNSUPPORTED else (int(cc[0]), int(cc[1])),
            vbios_version=UNSUPPORTED if vbios is UNSUPPORTED else text(vbios),
        )
        with self._lock:
            self._links[index] = links
            return self._infos.setdefault(index, info)

    @staticmethod
    def _probe_links(h: DeviceHandle) -> tuple[int, ...]:
        """Links whose state NVML answers; none when link 0 is NotSupported (e.g. a PCIe card or a VM)."""
        links: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError as err:
                code = error_code(err)
                if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                    break  # past the card's last link
                if code in UNSUPPORTED_CODES:
                    if link == 0:
                        break
                    continue
                raise translate(err, "nvmlDeviceGetNvLinkState") from err
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
            state = optional("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, Unsupported) or int(state) != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = optional("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if not isinstance(kind, Unsupported) and int(kind) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                peers.append("nvswitch")
                continue
            pci = optional("nvmlDeviceGetNvLinkRemotePciInfo", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            if not isinstance(pci, Unsupported):
                peers.append(text(pci.busId).upper())
        return tuple(peers)

    # --- the hot path ------------------------------------------------------------------------------------------

    @per_card
    def sample(self, index: int) -> DeviceSample:
        h = self._handle(index)
        info = self.device_info(index)
        values = fields.read_fields(h, self._field_request(index))

        def field(fid: int) -> int | float | Unsupported:
            return fields.device_field(values, fid)

        used, free, reserved = self._memory(h)
        util = optional("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, h)
        reasons = optional("nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is UNSUPPORTED:  # drivers before 535 only have the old name
            reasons = optional(
                "nvmlDeviceGetCurrentClocksThrottleReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h
            )
        pstate = as_int(optional("nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, h))
        compute_mode = optional("nvmlDeviceGetComputeMode", pynvml.nvmlDeviceGetComputeMode, h)
        mig_mode = self._mig_modes.for_cycle(index, h, util is not UNSUPPORTED)
        return DeviceSample(
            gpu_utilization_ratio=UNSUPPORTED if util is UNSUPPORTED else ratio(util.gpu),
            memory_utilization_ratio=UNSUPPORTED if util is UNSUPPORTED else ratio(util.memory),
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            temperature_gpu_celsius=scaled(
                optional("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                1.0,
            ),
            temperature_memory_celsius=scaled(field(fields.FI_MEMORY_TEMP), 1.0),
            power_draw_watts=scaled(optional("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h), 1e-3),
            power_limit_watts=scaled(
                optional("nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3
            ),
            energy_joules=scaled(field(fields.FI_ENERGY), 1e-3),
            sm_clock_mhz=as_int(
                optional("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
            ),
            memory_clock_mhz=as_int(
                optional("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
            ),
            clock_event_reasons=as_int(reasons),
            performance_state=UNSUPPORTED if pstate == _PSTATE_UNKNOWN else pstate,
            pcie_generation=as_int(
                optional("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
            ),
            pcie_width=as_int(optional("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
            pcie_replay_count=as_int(field(fields.FI_PCIE_REPLAY)),
            ecc=EccCounts(
                enabled_current=as_bool(field(fields.FI_ECC_CURRENT)),
                enabled_pending=as_bool(field(fields.FI_ECC_PENDING)),
                corrected_volatile=as_int(field(fields.FI_SBE_VOL)),
                uncorrected_volatile=as_int(field(fields.FI_DBE_VOL)),
                corrected_aggregate=as_int(field(fields.FI_SBE_AGG)),
                uncorrected_aggregate=as_int(field(fields.FI_DBE_AGG)),
            ),
            remapped_rows=fields.remapped_rows(h, values),
            recovery_action=as_int(field(fields.FI_RECOVERY_ACTION)),
            nvlinks=(
                fields.nvlink_samples(h, self._links.get(index, ()), values) if info.nvlink_count else UNSUPPORTED
            ),
            compute_mode=UNSUPPORTED if compute_mode is UNSUPPORTED else ComputeMode(int(compute_mode)),
            persistence_mode=as_bool(optional("nvmlDeviceGetPersistenceMode", pynvml.nvmlDeviceGetPersistenceMode, h)),
            mig_mode_current=UNSUPPORTED if isinstance(mig_mode, Unsupported) else mig_mode[0],
            mig_mode_pending=UNSUPPORTED if isinstance(mig_mode, Unsupported) else mig_mode[1],
        )

    def _field_request(self, index: int) -> tuple[fields.FieldKey, ...]:
        request = self._field_requests.get(index)
        if request is None:
            request = self._field_requests.setdefault(index, fields.field_request(self._links.get(index, ())))
        return request

    @staticmethod
    def _memory(h: DeviceHandle) -> tuple[int, int, int | Unsupported]:
        """(used, free, reserved): v2 splits out driver-reserved memory; v1 folds it into used."""
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
            return int(mem.used), int(mem.free), int(mem.reserved)
        except pynvml.NVMLError as err:
            fallback = UNSUPPORTED_CODES | {pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
            if error_code(err) not in fallback:
                raise translate(err, "nvmlDeviceGetMemoryInfo_v2") from err
        mem = call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        return int(mem.used), int(mem.free), UNSUPPORTED

    # --- profiling (GPM) and PCIe throughput: profiling.py -----------------------------------------------------

    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        return self._profiling.read(index, self._handle(index), mig_instances)

    def pcie_throughput(self, index: int) -> PcieThroughput:
        return self._profiling.pcie_throughput(self._handle(index))

    def refused_gpm_metric_ids(self, index: int) -> frozenset[int]:
        """GPM metric ids this card's driver refused, which profiling no longer asks for (bench/gpm_check.py)."""
        return self._profiling.refused_metric_ids(index)

    # --- processes: processes.py -------------------------------------------------------------------------------

    @per_card
    def processes(self, index: int) -> tuple[GpuProcess, ...] | Unknown:
        return self._processes.read(index, self._handle(index))

    # --- MIG: mig.py -------------------------------------------------------------------------------------------

    @per_card
    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        cached = self._profiles.get(index)
        if cached is not None:
            return cached
        profiles = mig.read_profiles(self._handle(index))
        with self._lock:
            return self._profiles.setdefault(index, profiles)

    @per_card
    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        h = self._handle(index)
        if not self._mig_modes.current(index, h):
            return ()
        return mig.list_instances(index, h, self.mig_profiles(index))

    @per_card
    def create_mig_instance(self, index: int, profile_id: int, placement_start: int) -> MigInstance:
        h = self._handle(index)
        mig.require_enabled(index, h)
        gi_id = mig.create_instance(index, h, self.mig_profiles(index), profile_id, placement_start)
        for instance in self.mig_instances(index):
            if instance.gpu_instance_id == gi_id:
                return instance
        raise BackendError(
            f"GPU instance {gi_id} was created on GPU {index} but no MIG device appeared",
            call="nvmlDeviceGetMigDeviceHandleByIndex",
        )

    @per_card
    def destroy_mig_instance(self, index: int, gpu_instance_id: int) -> None:
        mig.destroy_instance(index, self._handle(index), gpu_instance_id)

    # --- events: events.py -------------------------------------------------------------------------------------

    def wait_event(self, timeout_s: float) -> DeviceEvent | None:
        """The next XID or ECC event of any card (events.py keeps the set registered across resets)."""
        self._require_open()
        return self._event_set.wait(timeout_s)

    # --- renewing a card's caches (cards.py decides when) ------------------------------------------------------

    def watch_failure(self, index: int, err: BackendError) -> None:
        nvml_code = error_code(err.__cause__) if err.__cause__ is not None else None
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
            self._processes.forget(index)
            self._mig_modes.forget(index)
        if refresh.events:
            self._event_set.rebuild(f"GPU {index}: {refresh.reason}")

    # --- plumbing ----------------------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._open:
            raise DriverUnavailableError("NVML is not initialised: call open() first", call="nvmlInit")

    def _handle(self, index: int) -> DeviceHandle:
        """The device handle, cached by index; an index the node does not have is NotFoundError."""
        h = self._handles.get(index)
        if h is not None:
            return h
        self._require_open()
        if not 0 <= index < self._count:
            raise NotFoundError(
                f"no GPU with index {index} (node has {self._count})", call="nvmlDeviceGetHandleByIndex"
            )
        taken: DeviceHandle = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
        with self._lock:
            h = self._handles.setdefault(index, taken)
        refresh = self._cards.handle_taken(index, handle_key(h))
        if refresh is not None:
            self._renew(index, refresh)
        return h


__all__ = ["NvmlBackend"]
