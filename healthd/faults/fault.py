"""A fault as the engine keeps it, and the journal records that describe how it changed.

A fault is one problem with one identity (check, code, GPU) from the moment it opens until it resolves. Every
change the engine makes is a ``FaultRecord`` with the next node-wide sequence number; the record carries the whole
fault as it was after the change, so a subscriber never needs a second lookup.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import typing
from collections.abc import Callable, Mapping
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

    def to_json(self) -> dict[str, object]:
        """The fault as the journal, the outbox and the hook's ``fault_json`` hold it: one key per field."""
        return {name: _to_json(getattr(self, name)) for name, _, _ in _JSON_FIELDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        """A fault from its JSON; a key missing from an older row takes the field's default (KeyError without one)."""
        values: dict[str, Any] = {name: decode(data[name]) for name, decode, _ in _JSON_FIELDS if name in data}
        missing = [name for name, _, required in _JSON_FIELDS if required and name not in values]
        if missing:
            raise KeyError(missing[0])
        return cls(**values)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


# -- the fault's JSON, from the fields' types: a key per field; enums by name (IntEnum, lower case, as the hook
# protocol writes severity and action) or value (StrEnum); a GPU as an object with GpuRef's fields; null for None


def _to_json(value: object) -> object:
    if isinstance(value, enum.StrEnum):
        return value.value
    if isinstance(value, enum.IntEnum):
        return value.name.lower()
    if isinstance(value, GpuRef):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _gpu_from_json(raw: Mapping[str, Any]) -> GpuRef:
    return GpuRef(int(raw["index"]), raw["uuid"], raw["pci_bus_id"])


def _decoder(hint: object) -> Callable[[Any], object]:
    """How a field's JSON value becomes the field's value."""
    if type(None) in typing.get_args(hint):  # X | None
        (inner,) = (a for a in typing.get_args(hint) if a is not type(None))
        decode = _decoder(inner)
        return lambda raw: None if raw is None else decode(raw)
    if hint is GpuRef:
        return _gpu_from_json
    if typing.get_origin(hint) is Mapping:
        return _frozen
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        members = hint
        return lambda raw: members[raw.upper()]
    if hint in (str, int, float, bool) or (isinstance(hint, type) and issubclass(hint, enum.StrEnum)):
        return typing.cast("Callable[[Any], object]", hint)
    raise TypeError(f"no JSON form for a field of type {hint}")  # a new field's type: a bug, found at import


# (name, decoder, required) for each field of Fault, in declaration order
_JSON_FIELDS = tuple(
    (f.name, _decoder(hint), f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    for f in dataclasses.fields(Fault)
    for hint in [typing.get_type_hints(Fault)[f.name]]
)


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
class HookDelivery:
    """Where a fault's latest queued record stands with one hook target (the newest outbox row of the pair)."""

    target: str
    fault_id: str
    seq: int
    delivered_at: float | None  # None: not acknowledged yet
    attempts: int  # failed attempts so far
    last_error: str = ""  # the last failure, e.g. "UNAVAILABLE: hook command failed: exit 127"

    @property
    def state(self) -> str:
        """delivered, failing (attempted and refused or unreachable) or pending (queued, not tried yet)."""
        if self.delivered_at is not None:
            return "delivered"
        return "failing" if self.attempts else "pending"


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
