"""The daemon's own cycle steps out of the way of the requests the HTTP server is answering (exporter/inflight.py):
a card's lane before it takes a call, attribution before each card, the probe runner before each probe; never for
a request in flight longer than the bound, and never in a way that loses a call's deadline.

No test here times anything: each one proves an order of events, or that a wait ends where an unbounded one would
not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter import inflight
from exporter.attribution.attributor import Attributor
from exporter.attribution.resolver import ProcResolver
from exporter.backends.lanes import CallTimeoutError, DeviceAccess
from exporter.backends.simulated import SimulatedBackend
from exporter.inflight import RequestsInFlight
from exporter.sampler import Sampler, SamplerSettings
from healthd.findings import ProbeReport
from healthd.probes.runner import ProbeRunner

WAIT = 10.0  # seconds any step may take before the test fails (a bound for a broken build, not a measurement)
SETTINGS = SamplerSettings(call_deadline_seconds=WAIT, change_deadline_seconds=WAIT, open_deadline_seconds=WAIT)


class Watched(RequestsInFlight):
    """RequestsInFlight that says when someone starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.waits = 0

    def wait_idle(self, timeout: float) -> bool:
        self.waits += 1
        self.waiting.set()
        return super().wait_idle(timeout)


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Watched:
    monkeypatch.setattr(inflight, "BACKGROUND_WAIT_SECONDS", 3600.0)  # only the request's end lets work go on
    return Watched()


@pytest.fixture
def access(sim: SimulatedBackend, requests: Watched) -> Iterator[DeviceAccess]:
    device = DeviceAccess(sim, SETTINGS, give_way=requests)
    yield device
    if requests.busy:
        requests.end()
    device.shutdown(1.0)


def in_thread(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_give_way_returns_at_once_when_no_request_is_in_flight(requests: Watched) -> None:
    requests.give_way()
    assert requests.waits == 0


def test_give_way_waits_for_the_request_in_flight_until_it_is_answered(requests: Watched) -> None:
    events: list[str] = []
    requests.begin()

    def background() -> None:
        requests.give_way()
        events.append("background work")

    worker = in_thread(background)
    assert requests.waiting.wait(WAIT)
    events.append("request answered")
    requests.end()
    worker.join(WAIT)
    assert not worker.is_alive()
    assert events == ["request answered", "background work"]


def test_a_request_in_flight_past_the_bound_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inflight, "BACKGROUND_WAIT_SECONDS", 0.05)
    requests = Watched()
    requests.begin()  # never ends: a client that stopped reading its answer

    def background() -> None:
        for _ in range(10_000):
            requests.give_way()

    worker = in_thread(background)
    worker.join(WAIT)  # 10,000 checkpoints each waiting the bound would take 500 s
    assert not worker.is_alive()
    assert requests.waits >= 1, "it did wait, once the request was in flight"


def test_a_card_lane_takes_its_call_only_once_the_request_is_answered(access: DeviceAccess, requests: Watched) -> None:
    calls: list[str] = []
    requests.begin()

    def driver() -> str:
        calls.append("driver")
        return "answered"

    pending = access.submit(0, "sample", driver, WAIT)
    assert requests.waiting.wait(WAIT), "the lane waits for the request"
    assert calls == []
    requests.end()
    assert pending.result() == "answered"
    assert calls == ["driver"]


def test_node_wide_and_event_lanes_never_wait(access: DeviceAccess, requests: Watched) -> None:
    requests.begin()
    assert access.submit("node", "device_count", lambda: 8, WAIT).result() == 8
    assert access.submit("events", "wait", lambda: "event", WAIT).result() == "event"
    assert requests.waits == 0


def test_a_call_held_back_past_its_deadline_times_out_and_the_card_is_not_hung(
    access: DeviceAccess, requests: Watched
) -> None:
    """The call stays queued while its lane gives way, so its wait runs out as behind any call: its caller gets a
    timeout, the driver never sees the call, and the lane takes the next call as usual (no card is marked hung)."""
    calls: list[str] = []
    requests.begin()
    held = access.submit(0, "sample", lambda: calls.append("held"), 0.05)
    with pytest.raises(CallTimeoutError, match="waited"):
        held.result()
    assert access.hung() == ()
    requests.end()
    assert access.submit(0, "sample", lambda: "answered", WAIT).result() == "answered"
    assert calls == []


def test_attribution_gives_way_before_each_card(sim: SimulatedBackend, tmp_path: Path) -> None:
    snapshot = Sampler(sim, SETTINGS).run_once()
    checkpoints: list[int] = []
    attributor = Attributor(ProcResolver(tmp_path), checkpoint=lambda: checkpoints.append(len(checkpoints)))
    attributor.update(snapshot)
    assert len(checkpoints) == len(snapshot.gpus) == 8, "one per answering card"


class _Named:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self._events = events

    def evaluate(self, snapshot: object, now: float) -> ProbeReport:
        self._events.append(self.name)
        return ProbeReport(self.name, (), ())


class _Sink:
    def report(self, report: ProbeReport) -> None:
        pass

    def event(self, finding: object) -> None:
        pass


def test_the_probe_runner_gives_way_before_each_probe(sim: SimulatedBackend) -> None:
    events: list[str] = []
    probes = [_Named("a", events), _Named("b", events)]
    runner = ProbeRunner(probes, _Sink(), checkpoint=lambda: events.append("checkpoint"))
    runner.on_snapshot(Sampler(sim, SETTINGS).run_once())
    assert events == ["checkpoint", "a", "checkpoint", "b"]
