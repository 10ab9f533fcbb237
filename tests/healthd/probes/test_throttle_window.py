"""The clocks check counts slowdown samples as they enter and leave its window instead of rescanning the window every
cycle; its reports are those of the rescanning formula (reproduced here) over any run of samples hypothesis finds:
slowdown and other reasons, repeated samples, gaps longer than the window and stale cycles."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.backends.types import ClockEventReason
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, ProbeReport, Severity
from healthd.probes.common import ReportBuilder, evidence
from healthd.probes.throttle import CHECK, Settings, ThrottleProbe
from tests.support.clock import FakeClock
from tests.support.probe_node import Node


class _Rescanning:
    """The formula before the running count: the window's samples rescanned on every evaluation."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.history: dict[str, deque[tuple[float, int]]] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        t = self.settings
        report = ReportBuilder(CHECK)
        for g, ref, sample in report.fresh_cards(snapshot):
            reasons = sample.clock_event_reasons
            assert isinstance(reasons, int)
            history = self.history.setdefault(g.uuid or str(g.index), deque())
            if not history or history[-1][0] != g.sampled_at:
                history.append((g.sampled_at or now, reasons))
            while history and now - history[0][0] > t.window_seconds:
                history.popleft()
            findings: list[Finding] = []
            if len(history) >= t.min_samples:
                hits = sum(1 for _, r in history if r & ClockEventReason.SLOWDOWN)
                ratio = hits / len(history)
                if ratio >= t.active_ratio:
                    seen = 0
                    for _, r in history:
                        seen |= r
                    active = [reason.label for reason in ClockEventReason.slowdowns(seen)]
                    findings.append(
                        Finding(
                            CHECK,
                            "clocks_hw_slowdown",
                            Severity.WARNING,
                            Action.NONE,
                            f"clock slowdown ({', '.join(active)}) in {ratio:.0%} of samples over the last "
                            f"{t.window_seconds:g}s",
                            ref,
                            evidence(ratio=round(ratio, 3), reasons=",".join(active), samples=len(history)),
                        )
                    )
            report.gpu_done(ref, findings, "no sustained clock slowdown")
        return report.build()


@pytest.fixture(scope="module")
def template() -> Iterator[Snapshot]:
    node = Node("h200x1", FakeClock())
    yield node.tick()
    node.close()


REASONS = st.sampled_from(
    [
        ClockEventReason.HW_THERMAL_SLOWDOWN,
        ClockEventReason.HW_SLOWDOWN | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
        ClockEventReason.SW_THERMAL_SLOWDOWN,
        ClockEventReason.SW_POWER_CAP,
        ClockEventReason.GPU_IDLE,
        0,
        0x8 | 0x4,  # plain ints, as NVML's bits come
    ]
)
# seconds since the last cycle, the reasons, a new sample (or the last one again), the card fresh or stale
CYCLE = st.tuples(st.sampled_from([0.0, 5.0, 5.0, 60.0, 400.0]), REASONS, st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(CYCLE, min_size=1, max_size=80), st.sampled_from([60.0, 300.0]), st.integers(1, 6))
def test_running_count_gives_the_reports_of_the_rescanning_formula(
    template: Snapshot, cycles: list[tuple[float, int, bool, bool]], window: float, min_samples: int
) -> None:
    thresholds = Settings(window_seconds=window, active_ratio=0.6, min_samples=min_samples)
    probe, reference = ThrottleProbe(thresholds), _Rescanning(thresholds)
    g = template.gpus[0]
    assert g.sample is not None
    now = sampled_at = 1_800_000_000.0
    for dt, reasons, new_sample, fresh in cycles:
        now += dt
        if new_sample:
            sampled_at = now
        card = dataclasses.replace(
            g,
            sample=dataclasses.replace(g.sample, clock_event_reasons=reasons),
            sampled_at=sampled_at,
            fresh=fresh,
            error=None if fresh else "timeout",
        )
        snap = dataclasses.replace(template, gpus=(card,))
        assert probe.evaluate(snap, now) == reference.evaluate(snap, now)
