"""The sampler: deadlines per call, one stuck card stalls nothing else, failures show as data."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.settings import ConfigError, parse_section
from tests.support.clock import FakeClock

FAST = SamplerSettings(interval_seconds=0.2, call_deadline_seconds=0.15)


@pytest.fixture
def sampler(sim: SimulatedBackend, clock: FakeClock) -> Iterator[Sampler]:
    s = Sampler(sim, FAST, clock=clock)
    yield s
    sim.clear()
    s.stop()


def test_first_cycle_reads_every_card(sampler: Sampler) -> None:
    snap = sampler.run_once()
    assert snap.backend_up
    assert [g.index for g in snap.gpus] == list(range(8))
    assert all(g.fresh and g.sample is not None and g.info is not None for g in snap.gpus)
    assert snap.system is not None and snap.system.driver_version == "580.159.04"
    assert snap.counters.calls["sample"] == 8


def test_snapshots_are_numbered_and_immutable(sampler: Sampler) -> None:
    first = sampler.run_once()
    second = sampler.run_once()
    assert second.seq == first.seq + 1
    assert sampler.latest() is second
    with pytest.raises(AttributeError):
        second.seq = 99  # type: ignore[misc]


def test_hung_call_marks_only_that_card_and_counts_one_timeout(sampler: Sampler, sim: SimulatedBackend) -> None:
    sampler.run_once()
    sim.inject("hang", 3, {"call": "sample"})
    for _ in range(3):
        snap = sampler.run_once()
    stuck = snap.gpu(3)
    assert stuck is not None and not stuck.fresh and stuck.error_code == "timeout"
    assert stuck.sample is not None, "the last good reading is kept for context"
    assert all(g.fresh for g in snap.gpus if g.index != 3)
    assert snap.counters.timeouts == {"sample": 1}, "a call that stays hung is one timeout, not one per cycle"


def test_hung_card_recovers_when_the_call_returns(sampler: Sampler, sim: SimulatedBackend) -> None:
    sim.inject("hang", 5, {"call": "*"})
    sampler.run_once()
    sim.clear(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        snap = sampler.run_once()
        gpu = snap.gpu(5)
        if gpu is not None and gpu.fresh:
            break
    assert gpu is not None and gpu.fresh and gpu.error is None


def test_cycle_with_a_hung_card_returns_within_the_deadline(sim: SimulatedBackend, clock: FakeClock) -> None:
    """A cycle waits at most about one deadline for a stuck card instead of forever."""
    s = Sampler(sim, SamplerSettings(interval_seconds=10.0, call_deadline_seconds=0.1), clock=clock)
    sim.inject("hang", 0, {"call": "sample"})
    finished = threading.Event()

    def cycle() -> None:
        s.run_once()
        finished.set()

    threading.Thread(target=cycle, daemon=True).start()
    assert finished.wait(5.0), "run_once blocked on the hung card"
    sim.clear()
    s.stop()


def test_lost_gpu_is_reported_as_gpu_lost(sampler: Sampler, sim: SimulatedBackend) -> None:
    sampler.run_once()
    sim.inject("gpu_lost", 2)
    snap = sampler.run_once()
    gpu = snap.gpu(2)
    assert gpu is not None and not gpu.fresh and gpu.error_code == "gpu_lost"
    assert snap.counters.errors[("sample", "gpu_lost")] == 1
    assert gpu.info is not None, "identity stays known for labels"


def test_backend_that_cannot_open_is_retried(clock: FakeClock) -> None:
    sim = SimulatedBackend.from_name("h200x1", clock=clock)
    sim.set_version_mismatch(True)
    s = Sampler(sim, FAST, clock=clock)
    snap = s.run_once()
    assert not snap.backend_up and snap.gpus == ()
    assert snap.backend_error is not None and "version_mismatch" in snap.backend_error
    sim.set_version_mismatch(False)
    snap = s.run_once()
    assert snap.backend_up and len(snap.gpus) == 1 and snap.backend_error is None
    s.stop()


def test_background_loop_publishes_to_subscribers(sim: SimulatedBackend) -> None:
    s = Sampler(sim, SamplerSettings(interval_seconds=0.05, call_deadline_seconds=1.0))
    seen: list[int] = []
    got_three = threading.Event()

    def on_snapshot(snap: object) -> None:
        seen.append(snap.seq)  # type: ignore[attr-defined]
        if len(seen) >= 3:
            got_three.set()

    s.subscribe(on_snapshot)
    s.start()
    try:
        assert s.wait_first(5.0)
        assert got_three.wait(5.0)
    finally:
        s.stop()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_subscriber_failure_does_not_stop_sampling(sampler: Sampler) -> None:
    def broken(_: object) -> None:
        raise RuntimeError("boom")

    sampler.subscribe(broken)
    assert sampler.run_once().seq == 1
    assert sampler.run_once().seq == 2


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"interval_seconds": 0}, "sampler.interval_seconds: must be between 0.1 and 3600, got 0"),
        ({"interval_seconds": -1}, "sampler.interval_seconds: must be between 0.1 and 3600, got -1"),
        ({"call_deadline_seconds": 0}, "sampler.call_deadline_seconds: must be between 0.05 and 600, got 0"),
        (
            {"pcie_throughput_interval_seconds": 0.5},
            "sampler.pcie_throughput_interval_seconds: must be between 1 and 3600, got 0.5",
        ),
    ],
)
def test_settings_reject_nonsense(table: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_section(SamplerSettings, table, "sampler")
    assert str(err.value) == message
