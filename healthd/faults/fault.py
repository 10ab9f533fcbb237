"""A fault as the engine keeps it, and the journal records that describe how it changed.

A fault is one problem with one identity (check, code, GPU) from the moment it opens until it resolves. Every
change the engine makes is a ``FaultRecord`` with the next node-wide sequence number; the record carries the whole
fault as it was after the change, so a subscriber never needs a second lookup.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from healthd.findings import Action, Finding, FindingKind, GpuRef, Severity


class FaultState(enum.StrEnum):
    ACTIVE = "active"
    RESOLVED = "resolved"


class RecordKind(enum.StrEnum):
    OPENED = "opened"
    UPDATED = "updated"  # worse severity/action, or a periodic count update of a repeating event
    REOPENED = "reopened"  # the same identity came back within the flap window: same fault, not a new one
    ESCALATED = "escalated"  # opened as replace_node because it returned after K reboots
    RESOLVED = "resolved"


def identity_of(check: str, code: str, gpu: GpuRef | None) -> str:
    return f"{check}\x1f{code}\x1f{gpu.uuid if gpu else ''}"


def fault_id_for(identity: str, opened_seq: int) -> str:
    """Stable and unique: the identity plus the sequence number of the record that opened it."""
    return "flt-" + hashlib.sha256(f"{identity}\x1e{opened_seq}".encode()).hexdigest()[:20]


def _frozen(values: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True)
class Fault:
    id: str
    opened_seq: int
    check: str
    code: str
    kind: FindingKind  # from the finding that opened it
    gpu: GpuRef | None
    severity: Severity
    action: Action
    message: str
    evidence: Mapping[str, str]
    first_seen: float
    last_seen: float
    count: int  # events: occurrences; conditions: times opened or reopened
    state: FaultState
    boot_id: str  # boot in which it was last seen
    resolved_at: float | None = None
    resolve_reason: str = ""
    hooked: bool = False  # already queued to the replacement hooks (once per fault id)
    last_seq: int = 0  # sequence number of the latest record about this fault
    flaps: int = 0

    @property
    def identity(self) -> str:
        return identity_of(self.check, self.code, self.gpu)

    @property
    def active(self) -> bool:
        return self.state is FaultState.ACTIVE

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "opened_seq": self.opened_seq,
            "check": self.check,
            "code": self.code,
            "kind": self.kind.value,
            "gpu": None
            if self.gpu is None
            else {"index": self.gpu.index, "uuid": self.gpu.uuid, "pci_bus_id": self.gpu.pci_bus_id},
            "severity": self.severity.name.lower(),
            "action": self.action.label,
            "message": self.message,
            "evidence": dict(self.evidence),
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "count": self.count,
            "state": self.state.value,
            "boot_id": self.boot_id,
            "resolved_at": self.resolved_at,
            "resolve_reason": self.resolve_reason,
            "hooked": self.hooked,
            "last_seq": self.last_seq,
            "flaps": self.flaps,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        gpu = data["gpu"]
        return cls(
            id=data["id"],
            opened_seq=int(data["opened_seq"]),
            check=data["check"],
            code=data["code"],
            kind=FindingKind(data["kind"]),
            gpu=None if gpu is None else GpuRef(int(gpu["index"]), gpu["uuid"], gpu["pci_bus_id"]),
            severity=Severity[data["severity"].upper()],
            action=Action[data["action"].upper()],
            message=data["message"],
            evidence=_frozen(data["evidence"]),
            first_seen=float(data["first_seen"]),
            last_seen=float(data["last_seen"]),
            count=int(data["count"]),
            state=FaultState(data["state"]),
            boot_id=data["boot_id"],
            resolved_at=None if data["resolved_at"] is None else float(data["resolved_at"]),
            resolve_reason=data["resolve_reason"],
            hooked=bool(data["hooked"]),
            last_seq=int(data["last_seq"]),
            flaps=int(data.get("flaps", 0)),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def new_fault(
    finding: Finding, *, opened_seq: int, now: float, boot_id: str, action: Action, evidence: Mapping[str, str]
) -> Fault:
    identity = identity_of(finding.check, finding.code, finding.gpu)
    return Fault(
        id=fault_id_for(identity, opened_seq),
        opened_seq=opened_seq,
        check=finding.check,
        code=finding.code,
        kind=finding.kind,
        gpu=finding.gpu,
        severity=finding.severity,
        action=action,
        message=finding.message,
        evidence=_frozen(evidence),
        first_seen=now,
        last_seen=now,
        count=1,
        state=FaultState.ACTIVE,
        boot_id=boot_id,
    )


@dataclass(frozen=True, slots=True)
class FaultRecord:
    seq: int
    kind: RecordKind
    at: float
    fault: Fault
    detail: str = ""  # why, for a person: "condition cleared", "quiet for 3600s", "node rebooted"


@dataclass(frozen=True, slots=True)
class OutboxItem:
    target: str
    seq: int
    fault_id: str
    payload: str  # the fault as JSON, as it was when queued
    attempts: int
    next_attempt_at: float
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class FaultFilter:
    gpu: str = ""  # index or uuid; "" all
    check: str = ""
    state: FaultState | None = None
    min_severity: Severity | None = None
    min_action: Action | None = None
    since_seq: int = 0  # faults changed after this sequence number
    limit: int = 1000

    def matches(self, f: Fault) -> bool:
        if self.gpu and (f.gpu is None or self.gpu not in (str(f.gpu.index), f.gpu.uuid)):
            return False
        if self.check and f.check != self.check:
            return False
        if self.state is not None and f.state is not self.state:
            return False
        if self.min_severity is not None and f.severity < self.min_severity:
            return False
        if self.min_action is not None and f.action < self.min_action:
            return False
        return f.last_seq > self.since_seq
