"""The latest-wins hand-off: a slow subscriber skips snapshots, never delays publishing or other subscribers."""

from __future__ import annotations

import threading

from exporter.backends.simulated import SimulatedBackend
from exporter.bus import LatestBus
from exporter.sampler import Sampler, SamplerSettings
from tests.support.waiting import eventually


def test_a_blocked_subscriber_delays_nothing_and_gets_only_the_newest() -> None:
    bus: LatestBus[int] = LatestBus()
    release = threading.Event()
    slow_seen: list[int] = []
    fast_seen: list[int] = []
    fast_done = threading.Event()

    def slow(message: int) -> None:
        slow_seen.append(message)
        release.wait(10)

    def fast(message: int) -> None:
        fast_seen.append(message)
        if message == 50:
            fast_done.set()

    bus.subscribe(slow, "slow")
    bus.subscribe(fast, "fast")
    bus.publish(1)
    picked = threading.Event()
    threading.Thread(target=lambda: (eventually(lambda: slow_seen == [1], 10.0), picked.set()), daemon=True).start()
    assert picked.wait(10)
    for i in range(2, 51):
        bus.publish(i)  # returns at once although "slow" is stuck in its first message
    assert fast_done.wait(10), "the fast subscriber is not held up by the slow one"
    release.set()
    assert bus.wait_idle(10)
    assert slow_seen == [1, 50], "after the stuck one, straight to the newest"
    stats = {s.name: s for s in bus.stats()}
    assert stats["slow"].skipped == 48
    assert stats["slow"].delivered == len(slow_seen)
    assert fast_seen == sorted(fast_seen) and fast_seen[-1] == 50
    assert bus.close(5) == []


def test_a_failing_subscriber_is_counted_and_keeps_receiving() -> None:
    bus: LatestBus[int] = LatestBus()
    seen: list[int] = []

    def broken(message: int) -> None:
        seen.append(message)
        raise RuntimeError("boom")

    bus.subscribe(broken, "broken")
    for i in range(3):
        bus.publish(i)
        assert bus.wait_idle(5)
    assert seen == [0, 1, 2]
    assert bus.stats()[0].failures == 3
    bus.close(5)


def test_close_delivers_what_is_waiting_then_stops() -> None:
    bus: LatestBus[int] = LatestBus()
    seen: list[int] = []
    gate = threading.Event()
    bus.subscribe(lambda m: (gate.wait(5), seen.append(m)), "gated")
    bus.publish(1)
    bus.publish(2)
    gate.set()
    assert bus.close(5) == []
    assert seen[-1] == 2


def test_a_slow_subscriber_does_not_slow_sampling(sim: SimulatedBackend) -> None:
    """The sampler publishes every cycle while a probe is stuck (a slow disk under the fault journal)."""
    sampler = Sampler(sim, SamplerSettings(interval_seconds=60, call_deadline_seconds=2))
    stuck = threading.Event()
    sampler.subscribe(lambda _snap: stuck.wait(30), "stuck")
    try:
        seqs = [sampler.run_once().seq for _ in range(5)]
        assert seqs == [1, 2, 3, 4, 5]
        stats = {s.name: s for s in sampler.subscriber_stats()}
        assert stats["stuck"].delivered == 0 and stats["stuck"].skipped >= 3
        assert sampler.run_once().subscribers[0].name == "stuck", "subscriber health travels with the snapshot"
    finally:
        stuck.set()
        sampler.stop()
