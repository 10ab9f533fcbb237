"""A FaultReport is a fault's JSON document spread over the hook protocol's fields, plus the delivery envelope.

The document is the fault as the daemon journals it (``Fault.to_json`` in healthd/faults/fault.py), and
``fault_json`` carries all of it. The report's other fields carry a part of it, each under the document's own key,
but for two: ``fault_id`` is the document's ``id``, and ``gpu_index``/``gpu_uuid``/``pci_bus_id`` are its ``gpu``
object (``gpu_index`` -1 when it is null: node-wide). The daemon fills a report from a document here, and the
hook reads the document back from a report here, so the two sides cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from healthd.api.v1 import hook_pb2 as hpb

ENVELOPE = frozenset({"idempotency_key", "node_name", "seq", "fault_json"})  # about the delivery, not the fault
ID_FIELD = "fault_id"
GPU_FIELDS = {"gpu_index": "index", "gpu_uuid": "uuid", "pci_bus_id": "pci_bus_id"}  # field -> key in "gpu"
# the fields that carry the document's key of the same name: check, code, severity, ..., boot_id
SAME_NAMED = tuple(
    f.name for f in hpb.FaultReport.DESCRIPTOR.fields if f.name not in ENVELOPE | {ID_FIELD} | GPU_FIELDS.keys()
)


def report_of(document: Mapping[str, Any], *, document_json: str, seq: int, node_name: str) -> hpb.FaultReport:
    """The report for one delivery of a fault (``document``, whose text is ``document_json``)."""
    fields = {name: document[name] for name in SAME_NAMED}
    fields[ID_FIELD] = document["id"]
    gpu = document["gpu"]
    if gpu is None:
        fields["gpu_index"] = -1
    else:
        fields.update({field: gpu[key] for field, key in GPU_FIELDS.items()})
    report = json_format.ParseDict(fields, hpb.FaultReport())  # the proto's JSON mapping takes field names as keys
    report.idempotency_key = str(document["id"])
    report.node_name = node_name
    report.seq = seq
    report.fault_json = document_json
    return report


def document_of(report: hpb.FaultReport) -> dict[str, object]:
    """The fault a report carries: ``fault_json`` when it holds a JSON object (as the daemon sends it), otherwise
    what the report's own fields say of it (a sender that leaves ``fault_json`` empty)."""
    stored = _json_object(report.fault_json)
    if stored is not None:
        return stored
    document: dict[str, object] = {name: getattr(report, name) for name in SAME_NAMED}
    document["evidence"] = dict(report.evidence)
    document["id"] = getattr(report, ID_FIELD)
    document["gpu"] = (
        None if report.gpu_index < 0 else {key: getattr(report, field) for field, key in GPU_FIELDS.items()}
    )
    return document


def _json_object(text: str) -> dict[str, object] | None:
    """``text`` parsed when it is a JSON object; None otherwise (nesting too deep for the parser included)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
