"""Wall-clock steps, seen against the monotonic clock.

Leases are stored as wall-clock expiry times, so that they survive a restart. A step of the wall clock (an
operator's `date -s`, a VM resumed, NTP stepping instead of slewing) would move every lease by the step: a one-hour
lease reclaimed seconds after a +2 h step, a 5 s lease kept for two hours after a -2 h one. The partition manager
asks for the step since it last asked, before each lease decision, and moves the stored expiries with it.
"""

from __future__ import annotations

from collections.abc import Callable

STEP_TOLERANCE_SECONDS = 2.0  # less than this is drift or scheduling, not a step


class ClockSteps:
    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._last = (wall(), monotonic())

    def step(self) -> float:
        """Seconds the wall clock jumped (positive: forward) since the last call; 0.0 within the tolerance."""
        wall, mono = self._wall(), self._monotonic()
        last_wall, last_mono = self._last
        self._last = (wall, mono)
        jump = (wall - last_wall) - (mono - last_mono)
        return jump if abs(jump) >= STEP_TOLERANCE_SECONDS else 0.0
