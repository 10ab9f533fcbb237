"""ECC and memory: uncorrectable errors, correctable-error rate, row remapping (pending, failure, count).

Retired pages (pre-Ampere cards) are not read: the Backend does not expose nvmlDeviceGetRetiredPages, so on those
cards the remap sub-checks report unsupported and XID 63/64 lines (xid probe) are the only signal.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.backends.types import DeviceSample, Unsupported
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, GpuRef, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "ecc"


SECTION = "ecc"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.ecc]"""

    # No anchor sets a correctable-error rate (DCGM's DCGM_LIMIT_MAX_SBE_RATE=10 is marked "dummy value"); ours is
    # a warning only, never an action: XID 92 (excessive SBE interrupts) is the driver's own signal.
    correctable_rate_per_hour: float = option(100.0, above=0)
    correctable_window_seconds: float = option(3600.0, above=0)
    # A rate needs this much history, so a short burst right after start is not extrapolated to an hourly rate.
    correctable_min_span_seconds: float = option(600.0, above=0)
    # DCGM MonitorMemRowRemapUncorrectable: >= 512 uncorrectable remaps -> WARN (NVIDIA: 512 is the RMA limit).
    uncorrectable_remap_warn: int = option(512, min=1)


class EccProbe:
    name = CHECK

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._corrected: dict[str, deque[tuple[float, int]]] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        for g, ref, sample in report.fresh_cards(snapshot):
            ecc = sample.ecc
            rows = sample.remapped_rows
            if ecc.enabled_current is not True and isinstance(rows, Unsupported):
                report.unsupported(ref, "ECC is off or not supported and the card has no row remapping")
                continue
            findings = self._ecc(ref, g.uuid or str(g.index), ecc.enabled_current is True, sample, now)
            if not isinstance(rows, Unsupported):
                findings += self._remap(ref, rows.pending, rows.failure, rows.uncorrectable)
            report.gpu_done(ref, findings, "no ECC errors that need action")
        return report.build()

    def _ecc(self, ref: GpuRef, key: str, enabled: bool, sample: DeviceSample, now: float) -> list[Finding]:
        out: list[Finding] = []
        if not enabled:
            return out
        ecc = sample.ecc
        if not isinstance(ecc.uncorrected_volatile, Unsupported) and ecc.uncorrected_volatile > 0:
            # DCGM MonitorMemVolatileDbes: volatile DBE > 0 -> FAIL; NVSentinel maps it to COMPONENT_RESET. The
            # volatile counter clears on GPU reset, so the condition ends when the action is taken.
            out.append(
                Finding(
                    CHECK,
                    "ecc_uncorrectable_volatile",
                    Severity.CRITICAL,
                    Action.RESET_GPU,
                    f"{ecc.uncorrected_volatile} uncorrectable ECC error(s) since the last GPU reset",
                    ref,
                    evidence(uncorrected_volatile=ecc.uncorrected_volatile),
                )
            )
        if not isinstance(ecc.corrected_volatile, Unsupported):
            rate = self._corrected_rate(key, ecc.corrected_volatile, now)
            if rate is not None and rate >= self.settings.correctable_rate_per_hour:
                out.append(
                    Finding(
                        CHECK,
                        "ecc_correctable_rate",
                        Severity.WARNING,
                        Action.NONE,
                        f"correctable ECC errors at {rate:.0f}/h "
                        f"(threshold {self.settings.correctable_rate_per_hour:g}/h)",
                        ref,
                        evidence(rate_per_hour=round(rate, 1), corrected_volatile=ecc.corrected_volatile),
                    )
                )
        return out

    def _corrected_rate(self, key: str, count: int, now: float) -> float | None:
        t = self.settings
        history = self._corrected.setdefault(key, deque())
        if history and count < history[-1][1]:  # counter reset (GPU reset, driver reload)
            history.clear()
        history.append((now, count))
        while len(history) > 2 and now - history[1][0] >= t.correctable_window_seconds:
            history.popleft()
        first_t, first_count = history[0]
        span = now - first_t
        if span <= 0 or count == first_count:
            return None if span <= 0 else 0.0
        return (count - first_count) / max(span, t.correctable_min_span_seconds) * 3600.0

    def _remap(self, ref: GpuRef, pending: bool, failure: bool, uncorrectable: int) -> list[Finding]:
        out: list[Finding] = []
        if failure:
            # NVIDIA RMA policy: the row-remapping failure flag is the DRAM RMA criterion; GPUd -> HW inspection,
            # NVSentinel DCGM_FR_ROW_REMAP_FAILURE -> CONTACT_SUPPORT.
            out.append(
                Finding(
                    CHECK,
                    "ecc_row_remap_failure",
                    Severity.FATAL,
                    Action.REPLACE_NODE,
                    "row remapping failed: the card meets NVIDIA's memory RMA criterion",
                    ref,
                    evidence(uncorrectable_remaps=uncorrectable),
                )
            )
        if pending:
            # The remap takes effect at the next GPU reset (NVIDIA row-remapping doc); NVSentinel
            # DCGM_FR_PENDING_ROW_REMAP -> COMPONENT_RESET.
            out.append(
                Finding(
                    CHECK,
                    "ecc_row_remap_pending",
                    Severity.CRITICAL,
                    Action.RESET_GPU,
                    "a row remap is pending: the GPU needs a reset to apply it",
                    ref,
                    evidence(uncorrectable_remaps=uncorrectable),
                )
            )
        if uncorrectable >= self.settings.uncorrectable_remap_warn:
            out.append(
                Finding(
                    CHECK,
                    "ecc_uncorrectable_remaps",
                    Severity.WARNING,
                    Action.NONE,
                    f"{uncorrectable} rows remapped for uncorrectable errors "
                    f"(threshold {self.settings.uncorrectable_remap_warn})",
                    ref,
                    evidence(uncorrectable_remaps=uncorrectable),
                )
            )
        return out


def build(settings: Settings, host: ProbeHost) -> EccProbe:
    return EccProbe(settings)
