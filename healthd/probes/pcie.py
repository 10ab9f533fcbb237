"""PCIe link below its maximum width or generation, held over several samples (a warning).

Cards lower the link generation when idle to save power (the same card runs Gen1 idle and Gen5 busy), so the
generation is only judged while the card is busy; width does not change with load and is always judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.backends.types import ClockEventReason, DeviceSample, Unsupported
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "pcie"


SECTION = "pcie"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.pcie]"""

    consecutive_samples: int = option(3, min=1)  # a link retraining briefly is not a degraded link
    # the card counts as busy at this GPU utilization (a ratio), or, where utilization is not reported, when it is
    # not clocked down for idle
    busy_utilization: float = option(0.05, min=0, max=1)


def _busy(s: DeviceSample, threshold: float) -> bool:
    if not isinstance(s.gpu_utilization_ratio, Unsupported):
        return s.gpu_utilization_ratio >= threshold
    if not isinstance(s.clock_event_reasons, Unsupported):
        return not s.clock_event_reasons & ClockEventReason.GPU_IDLE
    return False


class PcieProbe:
    name = CHECK

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._streak: dict[tuple[str, str], int] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        for g, ref, s in report.fresh_cards(snapshot):
            info = g.info
            if info is None:  # no inventory reading: the card's maxima are not known
                report.stale(g)
                continue
            key = g.uuid or str(g.index)
            checks = []
            if isinstance(s.pcie_width, int) and isinstance(info.pcie_width_max, int):
                checks.append(("width", s.pcie_width, info.pcie_width_max, True))
            if isinstance(s.pcie_generation, int) and isinstance(info.pcie_generation_max, int):
                checks.append(
                    (
                        "generation",
                        s.pcie_generation,
                        info.pcie_generation_max,
                        _busy(s, self.settings.busy_utilization),
                    )
                )
            if not checks:
                report.unsupported(ref, "PCIe link width and generation are not reported")
                continue
            findings: list[Finding] = []
            for what, current, maximum, judged in checks:
                if not judged:
                    continue  # idle: keep the streak as it is
                streak = self._streak[(key, what)] = self._streak.get((key, what), 0) + 1 if current < maximum else 0
                if streak >= self.settings.consecutive_samples:
                    unit = "x" if what == "width" else "Gen"
                    shown = f"{unit}{current}" if what == "generation" else f"{current}{unit}"
                    best = f"{unit}{maximum}" if what == "generation" else f"{maximum}{unit}"
                    findings.append(
                        Finding(
                            CHECK,
                            f"pcie_{what}_degraded",
                            Severity.WARNING,
                            Action.NONE,
                            f"PCIe link {what} is {shown}, the card supports {best}",
                            ref,
                            evidence(current=current, maximum=maximum, samples=streak),
                        )
                    )
            report.gpu_done(ref, findings, "PCIe link at its maximum")
        return report.build()


def build(settings: Settings, host: ProbeHost) -> PcieProbe:
    return PcieProbe(settings)
