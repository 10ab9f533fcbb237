"""Compute mode and configuration anomalies: unexpected compute mode, MIG or ECC mode change pending, persistence off.

None of these is a hardware fault, so none asks for more than a GPU reset (a pending MIG/ECC mode change is
applied by one). A pending change must last ``pending_grace_seconds`` before it is reported, so the partition
service's own MIG switch (set mode, then reset) is not flagged while it is in progress.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.backends.types import ComputeMode, DeviceSample, Unsupported
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, GpuRef, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "configuration"


SECTION = "configuration"
COMPUTE_MODES = tuple(m.name.lower() for m in ComputeMode)
ANY = "any"  # not checked
_ON = {"on": True, "off": False, "enabled": True, "disabled": False}


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.configuration]: what each card should be set to ("any": not checked)."""

    # The default compute mode is what nvidia-smi shows on a stock node (H200 capture: Default).
    compute_mode: str = option("default", choices=(*COMPUTE_MODES, ANY), lower=True)
    # GPUd persistence-mode component: supported but disabled -> unhealthy; NVSentinel: non-fatal. A warning here.
    persistence_mode: str = option("on", choices=("on", "off", ANY), lower=True)
    ecc: str = option("enabled", choices=("enabled", "disabled", ANY), lower=True)
    pending_grace_seconds: float = option(300.0, min=0)


def _mode_name(mode: ComputeMode) -> str:
    return mode.name.lower()


class ConfigurationProbe:
    name = CHECK

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = s = settings or Settings()
        # what the cards should be, as the samples say it; None: not checked
        self._want_compute_mode = None if s.compute_mode == ANY else ComputeMode[s.compute_mode.upper()]
        self._want_persistence = _ON.get(s.persistence_mode)
        self._want_ecc = _ON.get(s.ecc)
        self._pending_since: dict[tuple[str, str], float] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        for g, ref, s in report.fresh_cards(snapshot):
            key = g.uuid or str(g.index)
            findings = self._compute_mode(ref, s) + self._persistence(ref, s) + self._ecc(ref, s)
            findings += self._pending(ref, key, "mig", s.mig_mode_current, s.mig_mode_pending, now)
            findings += self._pending(ref, key, "ecc", s.ecc.enabled_current, s.ecc.enabled_pending, now)
            report.gpu_done(ref, findings, "configuration as expected")
        return report.build()

    def _compute_mode(self, ref: GpuRef, s: DeviceSample) -> list[Finding]:
        want = self._want_compute_mode
        mode = s.compute_mode
        if want is None or isinstance(mode, Unsupported) or mode is want:
            return []
        # Prohibited means no CUDA context can be created at all: the card is useless for work until changed.
        severity = Severity.CRITICAL if mode is ComputeMode.PROHIBITED else Severity.WARNING
        return [
            Finding(
                CHECK,
                "compute_mode_unexpected",
                severity,
                Action.NONE,
                f"compute mode is {_mode_name(mode)}, expected {_mode_name(want)}",
                ref,
                evidence(compute_mode=_mode_name(mode), expected=_mode_name(want)),
            )
        ]

    def _persistence(self, ref: GpuRef, s: DeviceSample) -> list[Finding]:
        want = self._want_persistence
        if want is None or isinstance(s.persistence_mode, Unsupported) or s.persistence_mode is want:
            return []
        state = "on" if s.persistence_mode else "off"
        return [
            Finding(
                CHECK,
                "persistence_mode_unexpected",
                Severity.WARNING,
                Action.NONE,
                f"persistence mode is {state}, expected {'on' if want else 'off'}",
                ref,
                evidence(persistence_mode=state),
            )
        ]

    def _ecc(self, ref: GpuRef, s: DeviceSample) -> list[Finding]:
        want = self._want_ecc
        if want is None or isinstance(s.ecc.enabled_current, Unsupported) or s.ecc.enabled_current is want:
            return []
        state = "enabled" if s.ecc.enabled_current else "disabled"
        return [
            Finding(
                CHECK,
                "ecc_mode_unexpected",
                Severity.WARNING,
                Action.NONE,
                f"ECC is {state}, expected {'enabled' if want else 'disabled'}",
                ref,
                evidence(ecc=state),
            )
        ]

    def _pending(
        self, ref: GpuRef, key: str, what: str, current: bool | Unsupported, pending: bool | Unsupported, now: float
    ) -> list[Finding]:
        if isinstance(current, Unsupported) or isinstance(pending, Unsupported) or current == pending:
            self._pending_since.pop((key, what), None)
            return []
        since = self._pending_since.setdefault((key, what), now)
        if now - since < self.settings.pending_grace_seconds:
            return []
        label = "MIG" if what == "mig" else "ECC"
        return [
            Finding(
                CHECK,
                f"{what}_mode_pending",
                Severity.WARNING,
                Action.RESET_GPU,
                f"{label} mode change to {'enabled' if pending else 'disabled'} is pending: it takes effect at the "
                f"next GPU reset (pending for {now - since:.0f}s)",
                ref,
                evidence(current=current, pending=pending, pending_seconds=round(now - since)),
            )
        ]


def build(settings: Settings, host: ProbeHost) -> ConfigurationProbe:
    return ConfigurationProbe(settings)
