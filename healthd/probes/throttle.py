"""Clock slowdown held over a window (a warning): HW slowdown, HW thermal, HW power brake or SW thermal.

Each sample shows whether a slowdown reason (``ClockEventReason.SLOWDOWN``, the same set the dashboards show) is
active at that moment. GPUd's hw-slowdown component flags >= 0.6 events per minute over 10 minutes (one check a
minute), i.e. the reason active in 60% of checks; here the same share of samples in the window. SW thermal
slowdown (the GPU or its memory above its maximum operating temperature) counts too: GPUd flags that temperature
on its own. Software power capping and idle clocks are normal and ignored.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.backends.types import ClockEventReason, Unsupported
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, ProbeReport, Severity
from healthd.probes.base import ProbeHost
from healthd.probes.common import ReportBuilder, evidence, gpu_ref

CHECK = "clocks"


@dataclass(frozen=True, slots=True)
class ThrottleThresholds:
    window_seconds: float = 600.0  # GPUd hw-slowdown: 10 min window
    active_ratio: float = 0.6  # GPUd: 0.6 events/min at one check per minute
    min_samples: int = 5  # too few samples in the window: no verdict

    def __post_init__(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if not 0 < self.active_ratio <= 1:
            raise ValueError("active_ratio must be within (0, 1]")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")


class ThrottleProbe:
    name = CHECK

    def __init__(self, thresholds: ThrottleThresholds | None = None) -> None:
        self.thresholds = thresholds or ThrottleThresholds()
        self._history: dict[str, deque[tuple[float, int]]] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        t = self.thresholds
        report = ReportBuilder(CHECK)
        for g in snapshot.gpus:
            if not g.fresh or g.sample is None:
                report.stale(g)
                continue
            ref = gpu_ref(g)
            reasons = g.sample.clock_event_reasons
            if isinstance(reasons, Unsupported):
                report.unsupported(ref, "clock event reasons are not supported")
                continue
            history = self._history.setdefault(g.uuid or str(g.index), deque())
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
                            "clocks_hw_slowdown",  # the code predates SW thermal's inclusion; kept for consumers
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


SECTION = "clocks"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.clocks]: clock slowdowns active in this share of the window's samples."""

    window_seconds: float = option(600.0, above=0)
    active_ratio: float = option(0.6, above=0, max=1)


def build(settings: Settings, host: ProbeHost) -> ThrottleProbe:
    return ThrottleProbe(ThrottleThresholds(window_seconds=settings.window_seconds, active_ratio=settings.active_ratio))
