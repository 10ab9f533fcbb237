"""The device-access layer: lanes, deadlines, fail-fast on hung cards, one thread per lane, async waiters."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from exporter.backends.errors import GpuLostError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import CallTimeoutError, CardHungError, DeviceAccess
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import SamplerSettings
from exporter.settings import ConfigError, parse_section
from tests.support.waiting import eventually

FAST = SamplerSettings(call_deadline_seconds=0.2, change_deadline_seconds=0.3, open_deadline_seconds=0.5)


@pytest.fixture
def device(sim: SimulatedBackend) -> Iterator[GuardedBackend]:
    guarded = GuardedBackend(DeviceAccess(sim, FAST))
    yield guarded
    sim.clear()
    guarded.access.shutdown(1.0)


def lane_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("lane-")}


def test_calls_answer_like_the_backend(device: GuardedBackend, sim: SimulatedBackend) -> None:
    assert device.device_count() == sim.device_count()
    assert device.device_info(2) == sim.device_info(2)
    assert device.sample(2).memory_used_bytes >= 0
    counters = device.access.counters()
    assert counters.calls["device_count"] == 1 and counters.calls["sample"] == 1


def test_the_injector_is_the_backends_and_no_lane_carries_it(device: GuardedBackend, sim: SimulatedBackend) -> None:
    assert device.injector is sim.injector
    sim.inject("hang", 3, {"call": "*"})
    with pytest.raises(CallTimeoutError):
        device.sample(3)
    assert device.injector is not None
    assert "XID 79 on GPU 3" in device.injector.inject("xid", 3, {"code": "79"}), "a hung card still takes faults"
    assert "GPU 3" in device.injector.clear(3)
    assert eventually(lambda: not device.access.hung(), 5.0), "clearing the hang lets the stuck call return"


def test_backend_errors_pass_through_and_are_counted(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("gpu_lost", 4)
    with pytest.raises(GpuLostError):
        device.sample(4)
    assert device.access.counters().errors[("sample", "gpu_lost")] == 1
    assert device.access.hung() == (), "an error is an answer, not a hang"


def test_hung_call_times_out_once_then_the_card_fails_fast(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("hang", 3, {"call": "sample"})
    with pytest.raises(CallTimeoutError) as first:
        device.sample(3)
    assert first.value.scope == 3 and first.value.call == "sample"
    for call in (device.sample, device.processes, device.mig_instances):
        with pytest.raises(CardHungError) as again:
            call(3)
        assert "GPU 3 is not answering: sample has been stuck for" in str(again.value)
        assert again.value.stuck_call == "sample"
    counters = device.access.counters()
    assert counters.timeouts == {"sample": 1}, "one hung call is one timeout"
    assert counters.calls.get("processes", 0) == 0, "fail fast: refused at once, never queued behind the stuck call"
    assert counters.errors[("processes", "hung")] == 1
    assert device.sample(2).memory_used_bytes >= 0, "other cards answer"
    assert set(device.access.hung_cards()) == {3}


def test_a_hung_card_recovers_when_its_call_returns(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("hang", 5, {"call": "*"})
    with pytest.raises(CallTimeoutError):
        device.sample(5)
    sim.clear(5)
    assert eventually(lambda: not device.access.hung(), 5.0)
    assert device.sample(5).memory_used_bytes >= 0


def test_a_hung_card_costs_no_thread_however_often_it_is_called(device: GuardedBackend, sim: SimulatedBackend) -> None:
    for i in range(8):
        device.sample(i)
    before = {t.ident for t in threading.enumerate()}
    sim.inject("hang", 6, {"call": "mig_instances"})
    sim.inject("hang", 7, {"call": "*"})
    for _ in range(50):
        for gpu in (6, 7):
            with pytest.raises((CallTimeoutError, CardHungError)):
                device.mig_instances(gpu)
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert started == [], "the hung cards' own lanes carry their stuck calls; nothing else starts"
    assert {"lane-6", "lane-7"} <= lane_threads()


def test_calls_queued_behind_a_hung_call_fail_when_it_is_declared_hung(
    device: GuardedBackend, sim: SimulatedBackend
) -> None:
    sim.inject("hang", 1, {"call": "sample"})
    stuck = device.submit(1, "sample")
    queued = device.submit(1, "processes")
    with pytest.raises(CardHungError):
        queued.result()  # it waited for the stuck call's deadline, then failed as hung, without running
    with pytest.raises(CallTimeoutError):
        stuck.result()
    assert device.access.counters().calls.get("processes", 0) == 0


def test_a_late_answer_still_reaches_the_outcome(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("hang", 6, {"call": "create_mig_instance"})
    pending = device.aio.create_mig_instance(6, 19, 0)

    async def wait() -> None:
        await pending.wait()

    with pytest.raises(CallTimeoutError):
        asyncio.run(wait())
    assert not pending.outcome.done(), "still in the driver"
    sim.clear(6)
    instance = pending.outcome.result(timeout=5)
    assert instance.profile_id == 19 and instance.placement_start == 0


def test_an_outcome_taken_before_the_deadline_still_gets_the_late_answer(
    device: GuardedBackend, sim: SimulatedBackend
) -> None:
    """The outcome is the driver's answer, not the caller's timeout, whenever it was asked for."""
    sim.inject("hang", 6, {"call": "create_mig_instance"})
    pending = device.submit(6, "create_mig_instance", 19, 0)
    outcome = pending.outcome  # taken while the call is still inside its deadline
    with pytest.raises(CallTimeoutError):
        pending.result()
    assert not outcome.done(), "the caller's timeout is not the driver's answer"
    sim.clear(6)
    instance = outcome.result(timeout=5)
    assert instance.profile_id == 19 and pending.outcome is outcome


def test_the_outcome_of_an_answered_or_refused_call_is_that_answer(
    device: GuardedBackend, sim: SimulatedBackend
) -> None:
    answered = device.submit(2, "sample")
    sample = answered.result()
    assert answered.outcome.done() and answered.outcome.result() is sample
    sim.inject("hang", 3, {"call": "sample"})
    with pytest.raises(CallTimeoutError):
        device.sample(3)
    refused = device.submit(3, "processes")
    with pytest.raises(CardHungError) as caller:
        refused.result()
    assert refused.outcome.exception() is caller.value, "a call that never ran: both see why"


def test_a_waiter_behind_a_stuck_call_is_answered_when_the_lane_is_declared_hung(
    device: GuardedBackend, sim: SimulatedBackend
) -> None:
    """Another thread's waiter, whose own deadline is far off, learns at once that its lane is hung."""
    sim.inject("hang", 1, {"call": "sample"})
    stuck = device.submit(1, "sample")
    queued = device.access.submit(1, "slow_read", lambda: sim.processes(1), 600.0)
    errors: list[BaseException] = []

    def wait_queued() -> None:
        try:
            queued.result()
        except BaseException as exc:  # what the caller got, whatever it is
            errors.append(exc)

    waiter = threading.Thread(target=wait_queued)
    waiter.start()
    with pytest.raises(CallTimeoutError):
        stuck.result()  # this waiter declares the lane hung at the stuck call's deadline
    assert eventually(lambda: bool(errors), 10.0), "woken by the declaration, not left to its 600 s deadline"
    waiter.join(5.0)
    assert isinstance(errors[0], CardHungError) and errors[0].stuck_call == "sample"
    assert device.access.counters().calls.get("slow_read", 0) == 0


def test_calls_from_several_threads_on_one_lane_all_get_their_own_answers(device: GuardedBackend) -> None:
    answers: dict[int, list[int]] = {}

    def caller(n: int) -> None:
        answers[n] = [device.access.submit(0, "echo", lambda k=k: n * 1000 + k, 5.0).result() for k in range(200)]

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    assert answers == {n: [n * 1000 + k for k in range(200)] for n in range(4)}
    assert device.access.counters().calls["echo"] == 800


def test_async_waiters_never_block_the_loop(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("hang", 0, {"call": "sample"})

    async def scenario() -> None:
        hung = asyncio.create_task(device.aio.sample(0))
        turns = 0
        while not hung.done():  # this coroutine keeps running while the call is stuck in the driver
            turns += 1
            await asyncio.sleep(0.005)
        assert turns > 1
        with pytest.raises(CallTimeoutError):
            await hung

    asyncio.run(scenario())


def test_a_cancelled_async_caller_leaves_the_lane_usable(device: GuardedBackend, sim: SimulatedBackend) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(device.aio.sample(2))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await device.aio.sample(2)).memory_used_bytes >= 0

    asyncio.run(scenario())


def test_hung_lanes_are_found_without_a_waiter(sim: SimulatedBackend) -> None:
    """A caller that went away (cancelled) does not hide a hang: asking for hung lanes finds it."""
    access = DeviceAccess(sim, FAST)
    sim.inject("hang", 4, {"call": "sample"})
    access.submit(4, "sample", lambda: sim.sample(4), FAST.call_deadline_seconds)  # nobody waits for it
    assert eventually(lambda: bool(access.hung()), 5.0)
    (hung,) = access.hung()
    assert (hung.scope, hung.call) == (4, "sample")
    assert "GPU 4: sample has not returned after" in hung.describe(access.now())
    sim.clear()
    access.shutdown(1.0)


def test_shutdown_reports_calls_still_in_the_driver(sim: SimulatedBackend) -> None:
    access = DeviceAccess(sim, FAST)
    guarded = GuardedBackend(access)
    sim.inject("hang", 2, {"call": "*"})
    with pytest.raises(CallTimeoutError):
        guarded.sample(2)
    started = time.monotonic()
    hung = access.shutdown(0.1)
    assert time.monotonic() - started < 1.0
    assert [(h.scope, h.call) for h in hung] == [(2, "sample")]
    with pytest.raises(Exception, match="shutting down"):
        guarded.sample(1)


def test_event_wait_has_its_own_lane(device: GuardedBackend, sim: SimulatedBackend) -> None:
    assert device.wait_event(0.05) is None
    assert "lane-events" in lane_threads()


def test_an_event_a_stuck_wait_returns_late_is_the_next_waits_answer(
    device: GuardedBackend, sim: SimulatedBackend
) -> None:
    sim.inject("hang", 0, {"call": "wait_event"})
    with pytest.raises(CallTimeoutError):
        device.wait_event(0.05)
    sim.inject("xid", 2, {"code": "79"})
    sim.inject("xid", 5, {"code": "48"})
    sim.clear(0)
    assert eventually(lambda: not device.access.hung(), 5.0), "the stuck wait returned"
    first = device.wait_event(0.05)
    assert first is not None and (first.gpu_index, first.xid) == (2, 79), "the late answer is handed on, not lost"
    second = device.wait_event(0.5)
    assert second is not None and (second.gpu_index, second.xid) == (5, 48)
    assert device.wait_event(0.05) is None


def test_late_answers_of_plain_reads_are_not_replayed(device: GuardedBackend, sim: SimulatedBackend) -> None:
    sim.inject("hang", 1, {"call": "sample"})
    with pytest.raises(CallTimeoutError):
        device.sample(1)
    sim.clear(1)
    assert eventually(lambda: not device.access.hung(), 5.0)
    before = device.access.counters().calls["sample"]
    device.sample(1)
    assert device.access.counters().calls["sample"] == before + 1, "a read asks the driver again"


@pytest.mark.parametrize("name", ["call_deadline_seconds", "change_deadline_seconds", "open_deadline_seconds"])
def test_deadlines_reject_nonsense(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^sampler\.{name}: must be between 0.05 and 600, got 0$"):
        parse_section(SamplerSettings, {name: 0}, "sampler")
