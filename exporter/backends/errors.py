"""The few failures a backend reports. NVML error codes are translated once, at the backend boundary."""

from __future__ import annotations


class BackendError(Exception):
    """A backend call failed; ``call`` names the underlying call (e.g. ``nvmlDeviceGetMemoryInfo``)."""

    def __init__(self, message: str, *, call: str = "", code: str = "error") -> None:
        super().__init__(message)
        self.call = call
        self.code = code


class DriverUnavailableError(BackendError):
    """The library or driver cannot be initialised (not installed, not loaded, no permission)."""

    def __init__(self, message: str, *, call: str = "nvmlInit") -> None:
        super().__init__(message, call=call, code="driver_unavailable")


class VersionMismatchError(BackendError):
    """The kernel module and the user-space library disagree (NVML_ERROR_LIB_RM_VERSION_MISMATCH)."""

    def __init__(self, message: str, *, call: str = "nvmlInit") -> None:
        super().__init__(message, call=call, code="version_mismatch")


class GpuLostError(BackendError):
    """The card no longer answers (NVML_ERROR_GPU_IS_LOST): fallen off the bus or dead."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="gpu_lost")


class ResetRequiredError(BackendError):
    """The card needs a reset before it can be used again (NVML_ERROR_RESET_REQUIRED)."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="reset_required")


class NotFoundError(BackendError):
    """A device, instance or profile that was asked for does not exist."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="not_found")


class InUseError(BackendError):
    """A MIG instance cannot be destroyed while processes use it (NVML_ERROR_IN_USE)."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="in_use")


class InsufficientResourcesError(BackendError):
    """No room on the card for the requested MIG instance or placement."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="insufficient_resources")


class InvalidStateError(BackendError):
    """The card is in the wrong mode for the call (e.g. MIG call with MIG disabled)."""

    def __init__(self, message: str, *, call: str = "") -> None:
        super().__init__(message, call=call, code="invalid_state")
