"""One node status for /healthz, systemd STATUS, the status page and gRPC health."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.backends.lanes import HungCall
from exporter.backends.simulated import SimulatedBackend
from exporter.health import CardState, Level, stale_after, summarize
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.status_page import render_status_page
from tests.support.clock import FakeClock

STALE = 30.0


@pytest.fixture
def snap(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5, call_deadline_seconds=2), clock=clock)
    try:
        return sampler.run_once()
    finally:
        sampler.stop()


def test_before_the_first_sample_the_node_is_starting() -> None:
    status = summarize(None, now=0, mono_now=0, stale_seconds=STALE)
    assert status.level is Level.STARTING and not status.serving


def test_a_healthy_node_is_ok(snap: Snapshot, clock: FakeClock) -> None:
    status = summarize(snap, now=clock.now + 1, mono_now=100, stale_seconds=STALE)
    assert status.level is Level.OK and status.serving
    assert status.summary == "8 GPUs (simulated:h200x8), last sample 1.0s ago"
    assert status.cards_in(CardState.OK) == list(range(8))


def test_hung_cards_are_named_and_the_node_still_serves(snap: Snapshot, clock: FakeClock) -> None:
    hung = (HungCall(6, "mig_instances", since=40.0, deadline_seconds=2), HungCall(3, "sample", 90.0, 2))
    status = summarize(snap, now=clock.now, mono_now=100.0, stale_seconds=STALE, hung=hung)
    assert status.level is Level.DEGRADED and status.serving
    assert status.cards_in(CardState.HUNG) == [3, 6]
    assert "hung: GPU 3 (sample stuck for 10s), GPU 6 (mig_instances stuck for 60s)" in status.summary


def test_a_stuck_event_lane_and_a_hook_backlog_degrade(snap: Snapshot, clock: FakeClock) -> None:
    status = summarize(
        snap,
        now=clock.now,
        mono_now=10.0,
        stale_seconds=STALE,
        hung=(HungCall("events", "wait_event", 0.0, 3),),
        backlogs={"hook outbox": 2, "journal": 0},
    )
    assert status.level is Level.DEGRADED
    assert "stuck: the events lane: wait_event has not returned after 10s" in status.summary
    assert status.summary.endswith("backlog: hook outbox 2")
    assert dict(status.backlogs) == {"hook outbox": 2}


def test_lost_and_failing_cards_are_told_apart(snap: Snapshot, clock: FakeClock) -> None:
    gpus = list(snap.gpus)
    gpus[1] = replace(gpus[1], fresh=False, error="gpu_lost: GPU 1 is lost", error_code="gpu_lost")
    gpus[2] = replace(gpus[2], fresh=False, error="reset_required: ...", error_code="reset_required")
    gpus[4] = replace(gpus[4], fresh=False, error="timeout: sample has not returned", error_code="timeout")
    status = summarize(replace(snap, gpus=tuple(gpus)), now=clock.now, mono_now=0, stale_seconds=STALE)
    assert status.cards_in(CardState.LOST) == [1]
    assert status.cards_in(CardState.FAILING) == [2]
    assert status.cards_in(CardState.HUNG) == [4]


def test_stale_samples_and_a_down_backend_stop_serving(snap: Snapshot, clock: FakeClock) -> None:
    old = summarize(snap, now=clock.now + STALE + 1, mono_now=0, stale_seconds=STALE)
    assert old.level is Level.DOWN and not old.serving and "samples are stale" in old.summary
    down = replace(snap, backend_up=False, backend_error="driver_unavailable: no libnvidia-ml")
    status = summarize(down, now=clock.now, mono_now=0, stale_seconds=STALE)
    assert status.level is Level.DOWN and "no libnvidia-ml" in status.summary


def test_one_staleness_rule() -> None:
    assert stale_after(interval=5, read_deadline=2, open_deadline=10) == 29


def test_the_status_page_banner_shows_the_node_status(snap: Snapshot, clock: FakeClock) -> None:
    hung = (HungCall(6, "mig_instances", since=40.0, deadline_seconds=2),)
    status = summarize(snap, now=clock.now, mono_now=100.0, stale_seconds=STALE, hung=hung)
    page = render_status_page(snap, clock.now, node=status)
    assert 'class="banner warn"' in page
    assert "hung: GPU 6 (mig_instances stuck for 60s)" in page
