"""Faults to protobuf messages and JSON payloads (the health API and the hook protocol)."""

from __future__ import annotations

import json

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import hook_pb2 as hpb
from healthd.faults.engine import CheckState
from healthd.faults.fault import Fault, FaultRecord, FaultState
from healthd.findings import Action, GpuRef, Severity
from healthd.hook.report import report_of

# proto enums keep 0 for "unspecified", so the domain values map by name (ACTION_NONE = 1, ...)
SEVERITY_TO_PB = {s: f"SEVERITY_{s.name}" for s in Severity}
ACTION_TO_PB = {a: f"ACTION_{a.name}" for a in Action}
STATE_TO_PB = {FaultState.ACTIVE: "FAULT_STATE_ACTIVE", FaultState.RESOLVED: "FAULT_STATE_RESOLVED"}


def gpu_pb(gpu: GpuRef) -> pb.GpuRef:
    return pb.GpuRef(index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id)


def fault_pb(f: Fault) -> pb.Fault:
    msg = pb.Fault(
        id=f.id,
        opened_seq=f.opened_seq,
        last_seq=f.last_seq,
        check=f.check,
        code=f.code,
        kind=f.kind.value,
        severity=SEVERITY_TO_PB[f.severity],
        action=ACTION_TO_PB[f.action],
        message=f.message,
        evidence=dict(f.evidence),
        first_seen=f.first_seen,
        last_seen=f.last_seen,
        count=f.count,
        state=STATE_TO_PB[f.state],
        resolved_at=f.resolved_at or 0.0,
        resolve_reason=f.resolve_reason,
        boot_id=f.boot_id,
        flaps=f.flaps,
    )
    if f.gpu is not None:
        msg.gpu.CopyFrom(gpu_pb(f.gpu))
    return msg


def record_pb(r: FaultRecord) -> pb.FaultRecord:
    return pb.FaultRecord(seq=r.seq, kind=r.kind.value, at=r.at, detail=r.detail, fault=fault_pb(r.fault))


def check_pb(c: CheckState) -> pb.CheckHealth:
    msg = pb.CheckHealth(check=c.result.check, status=c.result.status.value, detail=c.result.detail, updated_at=c.at)
    if c.result.gpu is not None:
        msg.gpu.CopyFrom(gpu_pb(c.result.gpu))
    return msg


def fault_report_pb(payload: str, seq: int, node_name: str) -> hpb.FaultReport:
    """The hook request for an outbox item (``payload`` is the fault JSON as queued)."""
    return report_of(json.loads(payload), document_json=payload, seq=seq, node_name=node_name)
