from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FaultReport(_message.Message):
    __slots__ = ("idempotency_key", "node_name", "fault_id", "seq", "check", "code", "severity", "action", "message", "gpu_index", "gpu_uuid", "pci_bus_id", "evidence", "first_seen", "last_seen", "count", "boot_id", "fault_json")
    class EvidenceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    FAULT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    FAULT_JSON_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    node_name: str
    fault_id: str
    seq: int
    check: str
    code: str
    severity: str
    action: str
    message: str
    gpu_index: int
    gpu_uuid: str
    pci_bus_id: str
    evidence: _containers.ScalarMap[str, str]
    first_seen: float
    last_seen: float
    count: int
    boot_id: str
    fault_json: str
    def __init__(self, idempotency_key: _Optional[str] = ..., node_name: _Optional[str] = ..., fault_id: _Optional[str] = ..., seq: _Optional[int] = ..., check: _Optional[str] = ..., code: _Optional[str] = ..., severity: _Optional[str] = ..., action: _Optional[str] = ..., message: _Optional[str] = ..., gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., evidence: _Optional[_Mapping[str, str]] = ..., first_seen: _Optional[float] = ..., last_seen: _Optional[float] = ..., count: _Optional[int] = ..., boot_id: _Optional[str] = ..., fault_json: _Optional[str] = ...) -> None: ...

class ReportFaultAck(_message.Message):
    __slots__ = ("duplicate", "outcome")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    outcome: str
    def __init__(self, duplicate: _Optional[bool] = ..., outcome: _Optional[str] = ...) -> None: ...
