"""The NVML backend's pure helpers, without a GPU: error translation, optional readings, field-value decoding."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

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
from exporter.backends.nvml import NvmlBackend, calls, fields, mig
from exporter.backends.types import UNSUPPORTED


def _raiser(code: int) -> Any:
    def fail(*_args: Any) -> Any:
        raise pynvml.NVMLError(code)

    return fail


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLostError),
        (pynvml.NVML_ERROR_RESET_REQUIRED, ResetRequiredError),
        (pynvml.NVML_ERROR_NOT_FOUND, NotFoundError),
        (pynvml.NVML_ERROR_IN_USE, InUseError),
        (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, InsufficientResourcesError),
        (pynvml.NVML_ERROR_INVALID_STATE, InvalidStateError),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, VersionMismatchError),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, DriverUnavailableError),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, DriverUnavailableError),
        (pynvml.NVML_ERROR_UNINITIALIZED, DriverUnavailableError),
        (pynvml.NVML_ERROR_UNKNOWN, BackendError),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, BackendError),
        (pynvml.NVML_ERROR_NO_PERMISSION, BackendError),
    ],
)
def test_translate_maps_codes(code: int, expected: type[BackendError]) -> None:
    err = calls.translate(pynvml.NVMLError(code), "nvmlDeviceGetMemoryInfo")
    assert type(err) is expected
    assert err.call == "nvmlDeviceGetMemoryInfo"
    assert str(code) in str(err)


def test_no_permission_is_driver_unavailable_only_at_init() -> None:
    err = calls.translate(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), "nvmlInit", init=True)
    assert type(err) is DriverUnavailableError
    assert err.call == "nvmlInit"


def test_translate_uses_pynvml_subclasses() -> None:
    # pynvml.NVMLError(code) builds NVMLError_GpuIsLost etc.; the class name lands in the message.
    err = calls.translate(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), "nvmlDeviceGetPowerUsage")
    assert "NVMLError_GpuIsLost" in str(err)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_optional_turns_unsupported_into_marker(code: int) -> None:
    assert calls.optional("nvmlDeviceGetFanSpeed", _raiser(code)) is UNSUPPORTED


def test_optional_passes_values_and_arguments() -> None:
    assert calls.optional("nvmlDeviceGetClockInfo", lambda h, t: (h, t), "h", 1) == ("h", 1)


def test_optional_raises_translated_for_real_faults() -> None:
    with pytest.raises(GpuLostError) as info:
        calls.optional("nvmlDeviceGetTemperature", _raiser(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert info.value.call == "nvmlDeviceGetTemperature"
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_call_translates_even_not_supported() -> None:
    with pytest.raises(BackendError) as info:
        calls.call("nvmlDeviceGetMemoryInfo", _raiser(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert info.value.call == "nvmlDeviceGetMemoryInfo"


def test_skippable_skips_unused_slots() -> None:
    assert calls.skippable("x", _raiser(pynvml.NVML_ERROR_INVALID_ARGUMENT)) is None
    assert calls.skippable("x", _raiser(pynvml.NVML_ERROR_NOT_SUPPORTED)) is None
    with pytest.raises(InUseError):
        calls.skippable("x", _raiser(pynvml.NVML_ERROR_IN_USE))


def _field(value_type: int, member: str, value: float, ret: int = pynvml.NVML_SUCCESS) -> Any:
    fv = pynvml.c_nvmlFieldValue_t()
    fv.fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
    fv.valueType = value_type
    fv.nvmlReturn = ret
    setattr(fv.value, member, value)
    return fv


@pytest.mark.parametrize(
    ("value_type", "member", "raw", "expected"),
    [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 1.5, 1.5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 40, 40),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 7, 7),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 20160557, 20160557),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -3, -3),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -2, -2),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 9, 9),
    ],
)
def test_decode_field_reads_the_member_named_by_value_type(
    value_type: int, member: str, raw: float, expected: float
) -> None:
    decoded = fields.decode_field(_field(value_type, member, raw))
    assert decoded == expected
    assert type(decoded) is type(expected)


def test_decode_field_ignores_other_union_members() -> None:
    # The capture shows ECC_CURRENT as type 3 with dVal reading 5e-324: only the typed member is meaningful.
    fv = _field(pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 1)
    assert fields.decode_field(fv) == 1


@pytest.mark.parametrize("ret", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_UNKNOWN])
def test_decode_field_failed_return_is_unsupported(ret: int) -> None:
    assert fields.decode_field(_field(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 40, ret)) is UNSUPPORTED


def test_decode_field_unknown_type_is_unsupported() -> None:
    assert fields.decode_field(_field(99, "ullVal", 1)) is UNSUPPORTED


def test_profile_name_strips_mig_prefix() -> None:
    assert mig.profile_name("MIG 1g.18gb", 1, 16384) == "1g.18gb"
    assert mig.profile_name(b"MIG 1g.18gb+me", 1, 16384) == "1g.18gb+me"
    assert mig.profile_name("", 3, 71424) == "3g.70gb"  # no name from a v1 struct: synthesised


def test_list_call_supports_both_pynvml_signatures() -> None:
    def with_refs(device: Any, profile_id: int, placements_ref: Any, count_ref: Any) -> int:
        placements_ref[0].start, placements_ref[0].size = 0, 4
        placements_ref[1].start, placements_ref[1].size = 4, 4
        ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint)).contents.value = 2
        return 0

    def plain(device: Any, profile_id: int) -> list[Any]:
        p = pynvml.c_nvmlGpuInstancePlacement_t()
        p.start, p.size = 0, 8
        return [p]

    kind = pynvml.c_nvmlGpuInstancePlacement_t
    refs = calls.list_call("nvmlDeviceGetGpuInstancePossiblePlacements", with_refs, kind, 8, "h", 9)
    assert [(p.start, p.size) for p in refs] == [(0, 4), (4, 4)]
    listed = calls.list_call("nvmlDeviceGetGpuInstancePossiblePlacements", plain, kind, 8, "h", 0)
    assert [(p.start, p.size) for p in listed] == [(0, 8)]


def test_installed_pynvml_placements_wrapper_wants_refs() -> None:
    # The H200 capture's TypeError: nvidia-ml-py needs placementsRef and countRef; calls.list_call must see that.
    assert calls.takes_out_refs(pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, 2)


def test_unopened_backend_refuses_calls() -> None:
    backend = NvmlBackend()
    with pytest.raises(DriverUnavailableError):
        backend.sample(0)
    backend.close()  # closing what was never opened is fine
