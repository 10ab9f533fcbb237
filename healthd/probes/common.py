"""Small helpers every probe shares: GPU references, stale-card results, report assembly."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

from exporter.backends.types import DeviceInfo, DeviceSample
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import CheckResult, CheckStatus, Finding, GpuRef, ProbeReport, Severity

# card index -> the inventory record a reference was last made from, and that reference: the sampler hands every
# Snapshot the same record while the inventory is unchanged, so each probe's cards, every cycle, reuse one GpuRef
# (immutable; 64 cards x 8 probes a cycle built about 1 ms of them). Entries hold their record, so a record compared
# by identity is never a new one at a freed one's address; at most one entry per card index.
_REFS: dict[int, tuple[DeviceInfo, GpuRef]] = {}


def gpu_ref(gpu: GpuSnapshot) -> GpuRef:
    """The identity a finding carries; a card that never answered its inventory call has an empty uuid/bus id."""
    info = gpu.info
    if info is None:
        return GpuRef(index=gpu.index, uuid="", pci_bus_id="")
    kept = _REFS.get(gpu.index)
    if kept is not None and kept[0] is info:
        return kept[1]
    ref = GpuRef(index=gpu.index, uuid=info.uuid, pci_bus_id=info.pci_bus_id)
    _REFS[gpu.index] = (info, ref)
    return ref


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
        if not findings:  # the usual case: OK with ok_detail, without status_of's generator
            self._results.append(CheckResult(self.check, gpu, CheckStatus.OK, ok_detail))
            return
        self._findings.extend(findings)
        self.result(gpu, status_of(findings), "; ".join(f.message for f in findings))

    def fresh_cards(
        self, snapshot: Snapshot, unsupported: Callable[[GpuSnapshot], str | None] = lambda gpu: None
    ) -> Iterator[tuple[GpuSnapshot, GpuRef, DeviceSample]]:
        """The cards with a fresh sample, each with the identity its findings carry and that sample. The others get
        their result here and are skipped: ``unsupported`` (asked first, a reason or None) makes a card unsupported
        whether or not it answers; a card without a fresh sample is unknown."""
        for gpu in snapshot.gpus:
            reason = unsupported(gpu)
            if reason is not None:
                self.unsupported(gpu_ref(gpu), reason)
            elif not gpu.fresh or gpu.sample is None:
                self.stale(gpu)
            else:
                yield gpu, gpu_ref(gpu), gpu.sample

    def stale(self, gpu: GpuSnapshot) -> None:
        self.result(gpu_ref(gpu), CheckStatus.UNKNOWN, stale_detail(gpu))

    def unsupported(self, gpu: GpuRef, detail: str) -> None:
        self.result(gpu, CheckStatus.UNSUPPORTED, detail)

    def build(self) -> ProbeReport:
        return ProbeReport(self.check, tuple(self._results), tuple(merge_same_code(self._findings)))


def merge_same_code(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (code, GPU): the fault engine keys conditions on check, code and GPU, so two down links of
    one card (or two stuck processes) become one finding with both messages, the worst severity and action, and
    each evidence value joined with commas."""
    groups: dict[tuple[str, GpuRef | None], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.code, f.gpu), []).append(f)
    out: list[Finding] = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        joined: dict[str, list[str]] = {}
        for f in group:
            for key, value in f.evidence.items():
                values = joined.setdefault(key, [])
                if value not in values:
                    values.append(value)
        first = group[0]
        out.append(
            Finding(
                check=first.check,
                code=first.code,
                severity=max(f.severity for f in group),
                action=max(f.action for f in group),
                message="; ".join(dict.fromkeys(f.message for f in group)),
                gpu=first.gpu,
                evidence=MappingProxyType({k: ",".join(v) for k, v in joined.items()}),
                kind=first.kind,
            )
        )
    return out


def evidence(**values: object) -> Mapping[str, str]:
    """Evidence mapping with every value as a string (findings keep evidence as str -> str), read-only."""
    return MappingProxyType({k: str(v) for k, v in values.items()})
