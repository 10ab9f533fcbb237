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
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "clocks"
SLOWDOWN = int(ClockEventReason.SLOWDOWN)  # as a plain int: masking with the flag goes through enum's __and__


SECTION = "clocks"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.clocks]: clock slowdowns active in this share of the window's samples."""

    window_seconds: float = option(600.0, above=0)  # GPUd hw-slowdown: 10 min window
    active_ratio: float = option(0.6, above=0, max=1)  # GPUd: 0.6 events/min at one check per minute
    min_samples: int = option(5, min=1)  # too few samples in the window: no verdict


class _History:
    """One card's samples in the window, oldest first, and how many of them show a slowdown (counted as samples
    come and go, so a cycle costs O(1) rather than a pass over the window: 120 samples at the defaults)."""

    __slots__ = ("hits", "samples")

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()  # (sampled at, clock event reason bits)
        self.hits = 0


class ThrottleProbe:
    name = CHECK

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._history: dict[str, _History] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        t = self.settings
        report = ReportBuilder(CHECK)
        for g, ref, sample in report.fresh_cards(snapshot):
            reasons = sample.clock_event_reasons
            if isinstance(reasons, Unsupported):
                report.unsupported(ref, "clock event reasons are not supported")
                continue
            card = self._history.get(g.uuid or str(g.index))
            if card is None:
                card = self._history[g.uuid or str(g.index)] = _History()
            history = card.samples
            if not history or history[-1][0] != g.sampled_at:
                history.append((g.sampled_at or now, reasons))
                if int(reasons) & SLOWDOWN:
                    card.hits += 1
            while history and now - history[0][0] > t.window_seconds:
                if int(history.popleft()[1]) & SLOWDOWN:
                    card.hits -= 1
            findings: list[Finding] = []
            if len(history) >= t.min_samples:
                ratio = card.hits / len(history)
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


def build(settings: Settings, host: ProbeHost) -> ThrottleProbe:
    return ThrottleProbe(settings)
