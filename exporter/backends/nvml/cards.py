"""When NvmlBackend's per-card caches and event registration go stale, decided from what each card's calls return.

NvmlBackend keeps a card's device handle, identity (minor number included), NVLink list, field request and MIG
profile table for as long as they hold. They stop holding when:

- the card's MIG mode changes: NVML may unbind or reset the device to apply it, and NVIDIA warns that attributes
  such as the minor number can change (``nvmlDeviceSetMigMode``), so everything cached is read again;
- NVML rejects the cached handle (NOT_FOUND or INVALID_ARGUMENT from a per-card call): the handle is taken anew;
- a card that failed with GPU_IS_LOST or RESET_REQUIRED answers again: it was reset or recovered, and the event
  registration made before died with it;
- counters that only a reset or a driver reload takes back went down (energy since load, volatile ECC totals):
  the card was reset between two samples without any call seeing it fail.

The caches are then dropped, and the event set is rebuilt by the thread that waits on it. This object only
decides; it never calls the driver. Thread-safe: each card's calls come from its own thread.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from exporter.backends.errors import BackendError
from exporter.backends.types import DeviceSample, Unsupported

P = ParamSpec("P")
T = TypeVar("T")

# Per-card failures NVML clears only by a reset or recovery of the card (BackendError.code).
DOWN_CODES = frozenset({"gpu_lost", "reset_required"})


@dataclass(frozen=True, slots=True)
class Refresh:
    """What to renew on one card, and why (for the log)."""

    caches: bool  # drop the handle, identity, links, field request and profiles
    events: bool  # re-register the card's events (the whole set is rebuilt)
    reason: str


@dataclass
class _Seen:
    mig_mode: bool | None = None
    down: str | None = None  # the error code while the card fails as lost / reset-required
    energy: float | None = None
    ecc_volatile: tuple[int, int] | None = None  # corrected, uncorrected
    handle: int | None = None  # address of the last handle taken for the card


class CardWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cards: dict[int, _Seen] = {}

    def failed(self, index: int, code: str, nvml_code: int | None, rejected_handle: bool) -> Refresh | None:
        """A per-card call failed with ``code`` (BackendError.code); ``rejected_handle`` when NVML's return was
        NOT_FOUND or INVALID_ARGUMENT for a call made with the cached handle."""
        with self._lock:
            seen = self._cards.setdefault(index, _Seen())
            if code in DOWN_CODES:
                seen.down = code
                return None
        if rejected_handle:
            return Refresh(caches=True, events=False, reason=f"NVML rejected the cached handle (return {nvml_code})")
        return None

    def answered(self, index: int, sample: DeviceSample) -> Refresh | None:
        """The card's per-cycle sample came back: the one call that always reaches the card (others may answer
        from the backend's caches, which says nothing about the card)."""
        with self._lock:
            seen = self._cards.setdefault(index, _Seen())
            reasons: list[str] = []
            if seen.down is not None:
                reasons.append(f"the card answers again after {seen.down}")
                seen.down = None
            reasons += self._compare(seen, sample)
        if not reasons:
            return None
        return Refresh(caches=True, events=True, reason="; ".join(reasons))

    def handle_taken(self, index: int, address: int | None) -> Refresh | None:
        """A handle was taken for the card; a different one than before means a new registration is needed."""
        with self._lock:
            seen = self._cards.setdefault(index, _Seen())
            before, seen.handle = seen.handle, address
        if before is None or before == address:
            return None
        return Refresh(caches=False, events=True, reason="the card's handle changed")

    def forget(self) -> None:
        with self._lock:
            self._cards.clear()

    @staticmethod
    def _compare(seen: _Seen, s: DeviceSample) -> list[str]:
        reasons: list[str] = []
        mig = None if isinstance(s.mig_mode_current, Unsupported) else s.mig_mode_current
        if seen.mig_mode is not None and mig is not None and mig != seen.mig_mode:
            reasons.append(f"MIG mode turned {'on' if mig else 'off'}")
        seen.mig_mode = mig if mig is not None else seen.mig_mode
        energy = None if isinstance(s.energy_joules, Unsupported) else s.energy_joules
        if seen.energy is not None and energy is not None and energy < seen.energy:
            reasons.append("the energy counter went back (card reset)")
        seen.energy = energy if energy is not None else seen.energy
        cor, unc = s.ecc.corrected_volatile, s.ecc.uncorrected_volatile
        ecc = None if isinstance(cor, Unsupported) or isinstance(unc, Unsupported) else (cor, unc)
        if (
            seen.ecc_volatile is not None
            and ecc is not None
            and (ecc[0] < seen.ecc_volatile[0] or ecc[1] < seen.ecc_volatile[1])
        ):
            reasons.append("the volatile ECC counts went back (card reset)")
        seen.ecc_volatile = ecc if ecc is not None else seen.ecc_volatile
        return reasons


class Watched(Protocol):
    call_nesting: threading.local

    def watch_failure(self, index: int, err: BackendError) -> None: ...

    def watch_answer(self, index: int, result: object) -> None: ...


W = TypeVar("W", bound=Watched)


def per_card(method: Callable[Concatenate[W, int, P], T]) -> Callable[Concatenate[W, int, P], T]:
    """Marks a per-card Backend method whose outcome the backend hands to its :class:`CardWatch`. Calls made inside
    another per-card call (``sample`` reads ``device_info``) are not reported twice."""

    @functools.wraps(method)
    def watched(self: W, index: int, /, *args: P.args, **kwargs: P.kwargs) -> T:
        depth: int = getattr(self.call_nesting, "depth", 0)
        self.call_nesting.depth = depth + 1
        try:
            result = method(self, index, *args, **kwargs)
        except BackendError as err:
            if depth == 0:
                self.watch_failure(index, err)
            raise
        finally:
            self.call_nesting.depth = depth
        if depth == 0:
            self.watch_answer(index, result)
        return result

    return watched


__all__ = ["DOWN_CODES", "CardWatch", "Refresh", "Watched", "per_card"]
