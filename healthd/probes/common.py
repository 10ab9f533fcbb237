"""Small helpers every probe shares: GPU references, stale-card results, report assembly."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.snapshot import GpuSnapshot
from healthd.faults.model import CheckResult, CheckStatus, Finding, GpuRef, ProbeReport, Severity


def gpu_ref(gpu: GpuSnapshot) -> GpuRef:
    """The identity a finding carries; a card that never answered its inventory call has an empty uuid/bus id."""
    if gpu.info is None:
        return GpuRef(index=gpu.index, uuid="", pci_bus_id="")
    return GpuRef(index=gpu.index, uuid=gpu.info.uuid, pci_bus_id=gpu.info.pci_bus_id)


def status_of(findings: Iterable[Finding]) -> CheckStatus:
    """The check status a set of findings implies: the worst of them, OK when there are none."""
    worst = max((f.severity for f in findings), default=None)
    if worst is None or worst is Severity.INFO:
        return CheckStatus.OK
    if worst is Severity.WARNING:
        return CheckStatus.WARNING
    return CheckStatus.FAILED


def stale_detail(gpu: GpuSnapshot) -> str:
    return gpu.error or "no sample yet"


class ReportBuilder:
    """Collects one evaluation's results and findings; per-GPU status follows from that GPU's findings."""

    def __init__(self, check: str) -> None:
        self.check = check
        self._results: list[CheckResult] = []
        self._findings: list[Finding] = []

    def finding(self, finding: Finding) -> None:
        self._findings.append(finding)

    def result(self, gpu: GpuRef | None, status: CheckStatus, detail: str = "") -> None:
        self._results.append(CheckResult(self.check, gpu, status, detail))

    def gpu_done(self, gpu: GpuRef, findings: list[Finding], ok_detail: str = "") -> None:
        """Record ``findings`` for ``gpu`` and its status (worst finding; OK with ``ok_detail`` when none)."""
        self._findings.extend(findings)
        detail = "; ".join(f.message for f in findings) if findings else ok_detail
        self.result(gpu, status_of(findings), detail)

    def stale(self, gpu: GpuSnapshot) -> None:
        self.result(gpu_ref(gpu), CheckStatus.UNKNOWN, stale_detail(gpu))

    def unsupported(self, gpu: GpuRef, detail: str) -> None:
        self.result(gpu, CheckStatus.UNSUPPORTED, detail)

    def build(self) -> ProbeReport:
        return ProbeReport(self.check, tuple(self._results), tuple(self._findings))


def evidence(**values: object) -> dict[str, str]:
    """Evidence mapping with every value as a string (findings keep evidence as str -> str)."""
    return {k: str(v) for k, v in values.items()}
