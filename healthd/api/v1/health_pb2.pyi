from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_CRITICAL: _ClassVar[Severity]
    SEVERITY_FATAL: _ClassVar[Severity]

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_UNSPECIFIED: _ClassVar[Action]
    ACTION_NONE: _ClassVar[Action]
    ACTION_RESTART_APP: _ClassVar[Action]
    ACTION_RESET_GPU: _ClassVar[Action]
    ACTION_REBOOT_NODE: _ClassVar[Action]
    ACTION_REPLACE_NODE: _ClassVar[Action]

class FaultState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_STATE_UNSPECIFIED: _ClassVar[FaultState]
    FAULT_STATE_ACTIVE: _ClassVar[FaultState]
    FAULT_STATE_RESOLVED: _ClassVar[FaultState]
SEVERITY_UNSPECIFIED: Severity
SEVERITY_INFO: Severity
SEVERITY_WARNING: Severity
SEVERITY_CRITICAL: Severity
SEVERITY_FATAL: Severity
ACTION_UNSPECIFIED: Action
ACTION_NONE: Action
ACTION_RESTART_APP: Action
ACTION_RESET_GPU: Action
ACTION_REBOOT_NODE: Action
ACTION_REPLACE_NODE: Action
FAULT_STATE_UNSPECIFIED: FaultState
FAULT_STATE_ACTIVE: FaultState
FAULT_STATE_RESOLVED: FaultState

class GpuRef(_message.Message):
    __slots__ = ("index", "uuid", "pci_bus_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    pci_bus_id: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class Fault(_message.Message):
    __slots__ = ("id", "opened_seq", "last_seq", "check", "code", "kind", "gpu", "severity", "action", "message", "evidence", "first_seen", "last_seen", "count", "state", "resolved_at", "resolve_reason", "boot_id", "flaps")
    class EvidenceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OPENED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_REASON_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    FLAPS_FIELD_NUMBER: _ClassVar[int]
    id: str
    opened_seq: int
    last_seq: int
    check: str
    code: str
    kind: str
    gpu: GpuRef
    severity: Severity
    action: Action
    message: str
    evidence: _containers.ScalarMap[str, str]
    first_seen: float
    last_seen: float
    count: int
    state: FaultState
    resolved_at: float
    resolve_reason: str
    boot_id: str
    flaps: int
    def __init__(self, id: _Optional[str] = ..., opened_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., check: _Optional[str] = ..., code: _Optional[str] = ..., kind: _Optional[str] = ..., gpu: _Optional[_Union[GpuRef, _Mapping]] = ..., severity: _Optional[_Union[Severity, str]] = ..., action: _Optional[_Union[Action, str]] = ..., message: _Optional[str] = ..., evidence: _Optional[_Mapping[str, str]] = ..., first_seen: _Optional[float] = ..., last_seen: _Optional[float] = ..., count: _Optional[int] = ..., state: _Optional[_Union[FaultState, str]] = ..., resolved_at: _Optional[float] = ..., resolve_reason: _Optional[str] = ..., boot_id: _Optional[str] = ..., flaps: _Optional[int] = ...) -> None: ...

class FaultRecord(_message.Message):
    __slots__ = ("seq", "kind", "at", "detail", "fault")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: str
    at: float
    detail: str
    fault: Fault
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[str] = ..., at: _Optional[float] = ..., detail: _Optional[str] = ..., fault: _Optional[_Union[Fault, _Mapping]] = ...) -> None: ...

class CheckHealth(_message.Message):
    __slots__ = ("check", "gpu", "status", "detail", "updated_at")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    check: str
    gpu: GpuRef
    status: str
    detail: str
    updated_at: float
    def __init__(self, check: _Optional[str] = ..., gpu: _Optional[_Union[GpuRef, _Mapping]] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ..., updated_at: _Optional[float] = ...) -> None: ...

class GetNodeHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetNodeHealthResponse(_message.Message):
    __slots__ = ("checks", "active_faults", "last_seq", "boot_id")
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FAULTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[CheckHealth]
    active_faults: _containers.RepeatedCompositeFieldContainer[Fault]
    last_seq: int
    boot_id: str
    def __init__(self, checks: _Optional[_Iterable[_Union[CheckHealth, _Mapping]]] = ..., active_faults: _Optional[_Iterable[_Union[Fault, _Mapping]]] = ..., last_seq: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class ListFaultsRequest(_message.Message):
    __slots__ = ("gpu", "check", "state", "min_severity", "min_action", "since_seq", "limit")
    GPU_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MIN_SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MIN_ACTION_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    check: str
    state: FaultState
    min_severity: Severity
    min_action: Action
    since_seq: int
    limit: int
    def __init__(self, gpu: _Optional[str] = ..., check: _Optional[str] = ..., state: _Optional[_Union[FaultState, str]] = ..., min_severity: _Optional[_Union[Severity, str]] = ..., min_action: _Optional[_Union[Action, str]] = ..., since_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListFaultsResponse(_message.Message):
    __slots__ = ("faults", "last_seq")
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    faults: _containers.RepeatedCompositeFieldContainer[Fault]
    last_seq: int
    def __init__(self, faults: _Optional[_Iterable[_Union[Fault, _Mapping]]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class WatchFaultsRequest(_message.Message):
    __slots__ = ("after_seq",)
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    def __init__(self, after_seq: _Optional[int] = ...) -> None: ...

class Gap(_message.Message):
    __slots__ = ("from_seq", "to_seq")
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    to_seq: int
    def __init__(self, from_seq: _Optional[int] = ..., to_seq: _Optional[int] = ...) -> None: ...

class WatchFaultsResponse(_message.Message):
    __slots__ = ("record", "gap")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    record: FaultRecord
    gap: Gap
    def __init__(self, record: _Optional[_Union[FaultRecord, _Mapping]] = ..., gap: _Optional[_Union[Gap, _Mapping]] = ...) -> None: ...

class ResolveFaultRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResolveFaultResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: FaultRecord
    def __init__(self, record: _Optional[_Union[FaultRecord, _Mapping]] = ...) -> None: ...
