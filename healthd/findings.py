"""What a probe reports and what the fault engine keeps: findings, severities and recommended actions."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2  # the card or node misbehaves; work on it is at risk
    FATAL = 3  # the card or node cannot do useful work until acted on


class Action(enum.IntEnum):
    """Recommended action, ordered: a higher value subsumes the lower ones."""

    NONE = 0
    RESTART_APP = 1
    RESET_GPU = 2
    REBOOT_NODE = 3
    REPLACE_NODE = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class FindingKind(enum.StrEnum):
    CONDITION = "condition"  # level-triggered: reported on every evaluation while the problem lasts
    EVENT = "event"  # happens once (an XID line, an ECC event)


class CheckStatus(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    FAILED = "failed"
    UNSUPPORTED = "unsupported"  # the card cannot be checked this way (e.g. no NVLink): never a fault
    UNKNOWN = "unknown"  # no data yet, or the data is stale


@dataclass(frozen=True, slots=True)
class GpuRef:
    index: int
    uuid: str
    pci_bus_id: str


def _no_evidence() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem a probe sees.

    ``FindingKind.CONDITION`` findings are level-triggered: reported on every evaluation while the problem lasts, and
    the engine resolves the fault when a later evaluation of the same check no longer reports it.
    ``FindingKind.EVENT`` findings (an XID line, an ECC event) happen once; the engine dedups bursts of them.
    """

    check: str  # probe name, e.g. "ecc", "nvlink", "xid"
    code: str  # stable machine name, e.g. "ecc_uncorrectable_volatile", "xid_79"
    severity: Severity
    action: Action
    message: str  # one line for a person
    gpu: GpuRef | None = None  # None: node-wide
    evidence: Mapping[str, str] = field(default_factory=_no_evidence)
    kind: FindingKind = FindingKind.CONDITION


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The state of one check on one GPU (or node-wide) after an evaluation, for the health view and metrics."""

    check: str
    gpu: GpuRef | None
    status: CheckStatus
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ProbeReport:
    check: str
    results: tuple[CheckResult, ...]
    findings: tuple[Finding, ...]
