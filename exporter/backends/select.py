"""Pick the backend: the named simulation, the real driver, or (no GPU and no config) the h200x8 simulation."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from exporter.backends.errors import BackendError, DriverUnavailableError
from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend

log = structlog.get_logger("backend")

FALLBACK_SCENARIO = "h200x8"


@dataclass(frozen=True, slots=True)
class Choice:
    backend: Backend
    reason: str


def choose_backend(simulate: str | None, *, allow_fallback: bool) -> Choice:
    """``allow_fallback``: with no config file, a machine without an NVIDIA driver runs the simulated node."""
    if simulate:
        return Choice(SimulatedBackend.from_name(simulate), f"--simulate {simulate}")
    from exporter.backends.nvml import NvmlBackend

    real = NvmlBackend()
    if not allow_fallback:
        return Choice(real, "real GPUs (configured)")
    try:
        real.open()
        count = real.device_count()
    except DriverUnavailableError as exc:
        return Choice(
            SimulatedBackend.from_name(FALLBACK_SCENARIO),
            f"no NVIDIA driver found ({exc}); running the simulated {FALLBACK_SCENARIO} node",
        )
    except BackendError as exc:
        # a driver that is present but broken (e.g. version mismatch) is a fault to report, not to paper over
        return Choice(real, f"NVIDIA driver present but failing: {exc}")
    finally:
        real.close()
    if count == 0:
        return Choice(
            SimulatedBackend.from_name(FALLBACK_SCENARIO),
            f"the NVIDIA driver reports no GPU; running the simulated {FALLBACK_SCENARIO} node",
        )
    return Choice(real, f"real GPUs ({count} found)")
