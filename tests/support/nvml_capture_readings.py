"""The fake pynvml's answers for field values, NVLink, processes, MIG and events (tests/support/nvml_capture_fake.py
holds the card's state, the test knobs and the identity, memory, clock and power answers)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml

from tests.support.nvml_capture_data import GPM_PCIE_RX_KBS, NO_INSTANCE, U32_SPAN, _out, _value, error_code


@dataclass
class _EventSet:
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)  # gpu -> (event mask, resets at the time)
    queue: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # gpu, type, data, gi, ci


class NvmlReadings:
    """Mixed into FakeNvml: the calls below read its state (capture, handles, sets, errors, lost cards)."""

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
