"""The daemon's liveness as a front end sees it: unmonitored after the grace without contact, back on contact."""

from __future__ import annotations

from container.core.liveness import DaemonLiveness
from tests.support.clock import FakeClock


def test_liveness_turns_unmonitored_after_the_grace_and_back_on_contact() -> None:
    clock = FakeClock(100.0)
    liveness = DaemonLiveness(30, clock=clock)
    assert liveness.unmonitored() is None
    clock.advance(29)
    liveness.failed("UNAVAILABLE")
    assert liveness.unmonitored() is None
    clock.advance(2)
    reason = liveness.unmonitored()
    assert reason is not None and "has not answered for 31 s (last error: UNAVAILABLE)" in reason.message()
    liveness.contact()
    assert liveness.unmonitored() is None
