"""The fault's JSON, defined once (Fault.to_json/from_json from the dataclass fields), and the hook protocol's view of
it (healthd/hook/report.py): rows the journal and the outbox already hold load as before, and the report the daemon
sends and the document the hook's command reads are what they were.

The literal rows and outputs below were written by the code before the JSON shape was defined once (the hand-written
to_json/from_json, convert.fault_report_pb reading the keys, the hook rebuilding the fault from the report's fields).
"""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st

from healthd.api.v1 import hook_pb2 as hpb
from healthd.faults.convert import fault_report_pb
from healthd.faults.fault import Fault, FaultState
from healthd.findings import Action, FindingKind, GpuRef, Severity
from healthd.hook.reference import stdin_document
from healthd.hook.report import document_of

# Fault.dumps() of an XID fault on GPU 3, and of a resolved node-wide condition, as journaled before
XID_ROW = (
    '{"action":"reboot_node","boot_id":"b0a7c3e1","check":"xid","code":"xid_79","count":2,'
    '"evidence":{"pid":"4242","xid":"79"},"first_seen":1767225600.25,"flaps":1,'
    '"gpu":{"index":3,"pci_bus_id":"00000000:1B:00.0","uuid":"GPU-5e1f0c2a-93b4-4d6e-8f10-2b7c9d0e4a61"},'
    '"hooked":true,"id":"flt-0123456789abcdef0123","kind":"event","last_seen":1767225660.5,"last_seq":44,'
    '"message":"GPU has fallen off the bus","opened_seq":41,"resolve_reason":"","resolved_at":null,'
    '"severity":"fatal","state":"active"}'
)
NODE_ROW = (
    '{"action":"none","boot_id":"b","check":"driver","code":"driver_mismatch","count":1,"evidence":{},'
    '"first_seen":1.0,"flaps":0,"gpu":null,"hooked":false,"id":"flt-node","kind":"condition","last_seen":2.0,'
    '"last_seq":0,"message":"m","opened_seq":7,"resolve_reason":"condition cleared","resolved_at":3.5,'
    '"severity":"warning","state":"resolved"}'
)
XID_FAULT = Fault(
    id="flt-0123456789abcdef0123",
    opened_seq=41,
    check="xid",
    code="xid_79",
    kind=FindingKind.EVENT,
    gpu=GpuRef(3, "GPU-5e1f0c2a-93b4-4d6e-8f10-2b7c9d0e4a61", "00000000:1B:00.0"),
    severity=Severity.FATAL,
    action=Action.REBOOT_NODE,
    message="GPU has fallen off the bus",
    evidence=MappingProxyType({"xid": "79", "pid": "4242"}),
    first_seen=1767225600.25,
    last_seen=1767225660.5,
    count=2,
    state=FaultState.ACTIVE,
    boot_id="b0a7c3e1",
    hooked=True,
    last_seq=44,
    flaps=1,
)
# fault_report_pb(XID_ROW, 44, "gpu-node-7"), printed in text format
XID_REPORT = """
idempotency_key: "flt-0123456789abcdef0123" node_name: "gpu-node-7" fault_id: "flt-0123456789abcdef0123" seq: 44
check: "xid" code: "xid_79" severity: "fatal" action: "reboot_node" message: "GPU has fallen off the bus"
gpu_index: 3 gpu_uuid: "GPU-5e1f0c2a-93b4-4d6e-8f10-2b7c9d0e4a61" pci_bus_id: "00000000:1B:00.0"
evidence { key: "xid" value: "79" } evidence { key: "pid" value: "4242" }
first_seen: 1767225600.25 last_seen: 1767225660.5 count: 2 boot_id: "b0a7c3e1"
"""
# stdin_document of that report without its fault_json: the fault as the report's own fields tell it
FALLBACK_STDIN = (
    b'{"fault": {"action": "reboot_node", "boot_id": "b0a7c3e1", "check": "xid", "code": "xid_79", "count": 2, '
    b'"evidence": {"pid": "4242", "xid": "79"}, "first_seen": 1767225600.25, "gpu": {"index": 3, '
    b'"pci_bus_id": "00000000:1B:00.0", "uuid": "GPU-5e1f0c2a-93b4-4d6e-8f10-2b7c9d0e4a61"}, '
    b'"id": "flt-0123456789abcdef0123", "last_seen": 1767225660.5, "message": "GPU has fallen off the bus", '
    b'"severity": "fatal"}, "idempotency_key": "flt-0123456789abcdef0123", "node_name": "gpu-node-7", "seq": 44}\n'
)


def test_rows_journaled_before_load_and_write_back_byte_for_byte() -> None:
    fault = Fault.from_json(json.loads(XID_ROW))
    assert fault == XID_FAULT
    assert fault.dumps() == XID_ROW
    node = Fault.from_json(json.loads(NODE_ROW))
    assert (node.gpu, node.state, node.resolved_at, node.severity) == (None, FaultState.RESOLVED, 3.5, Severity.WARNING)
    assert node.dumps() == NODE_ROW


def test_a_row_from_before_flaps_loads_with_none_and_a_row_missing_a_required_key_is_refused() -> None:
    old = json.loads(XID_ROW)
    del old["flaps"]
    assert Fault.from_json(old).flaps == 0
    damaged = json.loads(XID_ROW)
    del damaged["boot_id"]
    with pytest.raises(KeyError, match="boot_id"):
        Fault.from_json(damaged)


def test_the_hook_report_for_a_queued_row_is_the_one_sent_before() -> None:
    expected = text_format.Parse(XID_REPORT, hpb.FaultReport())
    expected.fault_json = XID_ROW
    report = fault_report_pb(XID_ROW, 44, "gpu-node-7")
    assert report == expected
    node = fault_report_pb(NODE_ROW, 9, "n")
    assert (node.gpu_index, node.gpu_uuid, node.pci_bus_id, node.severity, node.action) == (
        -1,
        "",
        "",
        "warning",
        "none",
    )


def test_the_hook_command_reads_the_same_document_as_before() -> None:
    report = fault_report_pb(XID_ROW, 44, "gpu-node-7")
    stored = json.loads(stdin_document(report))
    assert stored == {
        "idempotency_key": "flt-0123456789abcdef0123",
        "node_name": "gpu-node-7",
        "seq": 44,
        "fault": json.loads(XID_ROW),
    }
    report.fault_json = ""
    assert stdin_document(report) == FALLBACK_STDIN


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_faults = st.builds(
    Fault,
    id=_text,
    opened_seq=st.integers(0, 2**63 - 1),
    check=_text,
    code=_text,
    kind=st.sampled_from(FindingKind),
    gpu=st.none() | st.builds(GpuRef, st.integers(0, 2**31 - 1), _text, _text),
    severity=st.sampled_from(Severity),
    action=st.sampled_from(Action),
    message=_text,
    evidence=st.dictionaries(_text, _text, max_size=3).map(MappingProxyType),
    first_seen=st.floats(0, 2e9),
    last_seen=st.floats(0, 2e9),
    count=st.integers(0, 2**63 - 1),
    state=st.sampled_from(FaultState),
    boot_id=_text,
    resolved_at=st.none() | st.floats(0, 2e9),
    resolve_reason=_text,
    hooked=st.booleans(),
    last_seq=st.integers(0, 2**63 - 1),
    flaps=st.integers(0, 1000),
)


@given(_faults)
def test_every_fault_survives_its_json_and_the_hook_reads_back_what_the_report_carries(fault: Fault) -> None:
    assert Fault.from_json(json.loads(fault.dumps())) == fault
    report = fault_report_pb(fault.dumps(), 1, "node")
    assert json.loads(report.fault_json) == fault.to_json()
    report.fault_json = ""  # the hook falls back on the report's own fields: each one is the fault's value
    fallback = document_of(report)
    assert fallback == {key: json.loads(fault.dumps())[key] for key in fallback}
    assert {"id", "gpu", "check", "code", "severity", "action", "message", "evidence", "count"} <= fallback.keys()
