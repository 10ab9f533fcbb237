"""One NVML call at a time: error translation, optional readings, enumerations, small conversions.

NVML error codes are translated here, once: NotSupported / FunctionNotFound on an optional reading become
``UNSUPPORTED``; everything else becomes one of the exceptions in ``exporter/backends/errors.py`` with ``call`` set
to the NVML function that failed. Every function here calls ``pynvml`` through the module (``pynvml.X``), never a
name imported from it, so a test that replaces a pynvml function is seen by every caller.
"""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final, ParamSpec, SupportsFloat, SupportsInt, TypeVar

import pynvml

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
from exporter.backends.types import UNSUPPORTED, Unsupported

T = TypeVar("T")
P = ParamSpec("P")

# Readings a card may simply not have: these become UNSUPPORTED, never exceptions.
UNSUPPORTED_CODES: Final = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# Returned by profile/link enumerations past the last valid entry.
SKIP_CODES: Final = UNSUPPORTED_CODES | {pynvml.NVML_ERROR_INVALID_ARGUMENT}
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


def error_code(err: BaseException) -> int | None:
    """The NVML return code carried by a ``pynvml.NVMLError``; None for anything else."""
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def translate(err: BaseException, call: str, *, init: bool = False) -> BackendError:
    """Map one ``pynvml.NVMLError`` to the backend's exceptions; ``init`` widens what counts as "no driver"."""
    code = error_code(err)
    message = f"{call} failed: {type(err).__name__} (NVML return {code})"
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return VersionMismatchError(message, call=call)
    if code in _DRIVER_CODES or (init and code == pynvml.NVML_ERROR_NO_PERMISSION):
        return DriverUnavailableError(message, call=call)
    return _ERROR_CLASSES.get(code if code is not None else -1, BackendError)(message, call=call)


def call(name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one NVML call; any NVML error leaves as a translated exception naming ``name``."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as err:
        raise translate(err, name) from err


def optional(name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | Unsupported:
    """Like :func:`call`, but NotSupported / FunctionNotFound return ``UNSUPPORTED``."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as err:
        if error_code(err) in UNSUPPORTED_CODES:
            return UNSUPPORTED
        raise translate(err, name) from err


def skippable(name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """For enumerations: None where NVML answers NotSupported / InvalidArgument (an unused profile or link slot)."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as err:
        if error_code(err) in SKIP_CODES:
            return None
        raise translate(err, name) from err


def takes_out_refs(fn: Callable[..., Any], plain_arity: int) -> bool:
    """True when a pynvml list wrapper wants caller-allocated (array, count) arguments.

    nvidia-ml-py 12.x/13.x declare e.g. ``nvmlDeviceGetGpuInstancePossiblePlacements(device, profileId,
    placementsRef, countRef)``; other builds return a Python list from ``(device, profileId)``.
    """
    try:
        return len(inspect.signature(fn).parameters) > plain_arity
    except (TypeError, ValueError):
        return True


def list_call(
    name: str,
    fn: Callable[..., Any],
    item_type: type[ctypes.Structure | ctypes._Pointer[Any]],
    capacity: int,
    *args: object,
) -> list[Any]:
    """Call a pynvml enumeration in whichever signature the installed wrapper has; NotSupported is empty.
    ``item_type`` is the ctypes type of one entry: a struct (a placement) or a pointer (an instance's handle)."""
    if not takes_out_refs(fn, len(args)):
        listed = optional(name, fn, *args)
        return [] if isinstance(listed, Unsupported) else list(listed)
    count = ctypes.c_uint(capacity)
    items = (item_type * capacity)()
    if optional(name, fn, *args, items, ctypes.byref(count)) is UNSUPPORTED:
        return []
    return list(items[: min(count.value, capacity)])


# --- small conversions -----------------------------------------------------------------------------------------


def text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def as_int(value: SupportsInt | Unsupported | None) -> int | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else int(value)


def as_bool(value: object) -> bool | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else bool(value)


def scaled(value: SupportsFloat | Unsupported | None, factor: float) -> float | Unsupported:
    return UNSUPPORTED if value is UNSUPPORTED or value is None else float(value) * factor


def ratio(percent: SupportsFloat) -> float:
    """NVML's percent as a ratio, clamped to 0-1."""
    return min(max(float(percent) / 100.0, 0.0), 1.0)


__all__ = [
    "SKIP_CODES",
    "UNSUPPORTED_CODES",
    "as_bool",
    "as_int",
    "call",
    "error_code",
    "list_call",
    "optional",
    "ratio",
    "scaled",
    "skippable",
    "takes_out_refs",
    "text",
    "translate",
]
