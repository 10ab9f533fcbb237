"""A fake ``pynvml`` for :class:`exporter.backends.nvml.NvmlBackend`, answering from a real H200 capture.

The answers come from ``tests/fixtures/h200`` (``nvml-inventory.json`` and ``mig-probe.log``), measured on one
NVIDIA H200 SXM in a VM: no NVLink, MIG off, ECC on. :func:`install` monkeypatches every ``pynvml`` function the
backend calls; NVML errors are raised as ``pynvml.NVMLError(code)``, as the real wrappers do, and wherever the
capture says "Not Supported" the fake raises NotSupported (fan, NUMA node, retired pages, NVLink when
``nvlinks=0``). Readings the capture lacks are modelled and marked as such below (GPM: :class:`GpmModel`; with MIG
on, the utilization rates answer NotSupported, as NVML's documentation of ``nvmlDeviceGetUtilizationRates`` says).

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from tests.support.nvml_capture_data import (
    CAPTURED_PROCESS,
    MAX_CLOCKS_MHZ,
    MAX_CLOCKS_MHZ_VIDEO,
    NO_INSTANCE,
    Capture,
    GpmModel,
    _value,
    load_capture,
)
from tests.support.nvml_capture_readings import NvmlReadings, _EventSet


@dataclass
class FakeNvml(NvmlReadings):
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
    cuda_driver_version: int | None = None  # set: the CUDA version the driver reports instead of the captured 13000

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
        if self.cuda_driver_version is not None:
            return self.cuda_driver_version
        return int(_value(self.capture.system["cuda_driver"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion_v2()

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
        if self.mig:  # NVML's documentation: "On MIG-enabled GPUs, querying device utilization rates is not supported"
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
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


MODELLED_CALLS: tuple[str, ...] = tuple(
    name for name in dir(FakeNvml) if name.startswith("nvml") and callable(getattr(FakeNvml, name))
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
