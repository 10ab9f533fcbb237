"""Alertmanager webhook -> fault reports: the conversion, fuzzed payloads, the HTTP server with a real client."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.hook.alertmanager import (
    AlertWebhookServer,
    ForwardError,
    JsonLinesForwarder,
    PayloadError,
    alerts_to_faults,
    make_forwarder,
)

# the fields of FaultReport in proto/healthd/api/v1/hook.proto (ReplacementHook.ReportFault)
FAULT_REPORT_FIELDS = (
    "idempotency_key", "node_name", "fault_id", "seq", "check", "code", "severity", "action", "message",
    "gpu_index", "gpu_uuid", "pci_bus_id", "evidence", "first_seen", "last_seen", "count", "boot_id", "fault_json",
)  # fmt: skip


def alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    base = {
        "alertname": "XpuGpuFallenOffBus",
        "instance": "node7:9410",
        "job": "xpu-healthd",
        "severity": "fatal",
        "action": "replace_node",
        "gpu": "3",
        "uuid": "GPU-3",
    }
    return {
        "status": status,
        "labels": {**base, **labels},
        "annotations": {"summary": "GPU 3 on node7:9410 has fallen off the bus", "runbook": "Replace the node."},
        "startsAt": "2026-11-29T23:10:32.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "7c2b5f0e9a1d3c44",
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    """An Alertmanager 0.25 webhook body (the fields it sends, with values like the ones it sends)."""
    return {
        "version": "4",
        "groupKey": '{}/{action="replace_node"}:{alertname="XpuGpuFallenOffBus"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "standby-replacement",
        "groupLabels": {"alertname": "XpuGpuFallenOffBus"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def test_firing_replace_node_alert_becomes_one_fault() -> None:
    result = alerts_to_faults(payload(alert()))
    assert result.skipped == ()
    (fault,) = result.faults
    assert fault["node_name"] == "node7" and fault["idempotency_key"] == fault["fault_id"]
    assert fault["action"] == "replace_node" and fault["severity"] == "fatal"
    assert fault["code"] == "XpuGpuFallenOffBus"
    assert fault["gpu_index"] == 3 and fault["gpu_uuid"] == "GPU-3"
    assert fault["message"] == "GPU 3 on node7:9410 has fallen off the bus"
    assert fault["evidence"]["runbook"] == "Replace the node."
    assert fault["evidence"]["label.instance"] == "node7:9410"
    assert json.loads(fault["fault_json"])["fingerprint"] == "7c2b5f0e9a1d3c44"
    assert fault["first_seen"] == datetime(2026, 11, 29, 23, 10, 32, 123456, tzinfo=UTC).timestamp()
    assert fault["evidence"]["receiver"] == "standby-replacement"
    assert set(fault) == set(FAULT_REPORT_FIELDS)


def test_fault_id_is_stable_across_resends_and_new_per_firing() -> None:
    first = alerts_to_faults(payload(alert())).faults[0]["fault_id"]
    again = alerts_to_faults(payload(alert())).faults[0]["fault_id"]
    later = alert()
    later["startsAt"] = "2026-11-30T01:00:00Z"
    assert first == again
    assert alerts_to_faults(payload(later)).faults[0]["fault_id"] != first


def test_fault_code_and_node_labels_win() -> None:
    (fault,) = alerts_to_faults(payload(alert(alertname="XpuFatalXid", code="xid_79", node="gpu-node-7"))).faults
    assert fault["code"] == "xid_79" and fault["node_name"] == "gpu-node-7"


def test_the_daemons_fault_id_label_is_the_key_the_daemons_push_uses() -> None:
    labelled = alert(alertname="XpuFatalXid", code="xid_79", node="gpu-node-7", fault_id="flt-84084791bbcdd2a56ec9")
    (fault,) = alerts_to_faults(payload(labelled)).faults
    assert fault["idempotency_key"] == fault["fault_id"] == "flt-84084791bbcdd2a56ec9"
    resent = dict(labelled, startsAt="2026-11-30T01:00:00Z")  # a new firing of the same fault: still the same key
    assert alerts_to_faults(payload(resent)).faults[0]["idempotency_key"] == "flt-84084791bbcdd2a56ec9"


@pytest.mark.parametrize(
    ("instance", "node"), [("10.0.0.5:9410", "10.0.0.5"), ("[fd00::5]:9410", "fd00::5"), ("node7", "node7")]
)
def test_node_from_instance(instance: str, node: str) -> None:
    assert alerts_to_faults(payload(alert(instance=instance))).faults[0]["node_name"] == node


def test_resolved_none_and_unknown_actions_are_skipped_with_reasons() -> None:
    result = alerts_to_faults(
        payload(
            alert("resolved"),
            alert(alertname="XpuGpuThermalSlowdown", action="none"),
            alert(alertname="Other", action="panic"),
            alert(alertname="XpuApplicationXid", action="restart_app", severity="warning", code="xid_13"),
        )
    )
    assert [f["code"] for f in result.faults] == ["xid_13"]
    assert len(result.skipped) == 3
    assert any("resolved" in s for s in result.skipped)
    assert any("panic" in s for s in result.skipped)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "payload: expected a JSON object"),
        ({"version": "3", "alerts": []}, "version"),
        ({"version": "4"}, "alerts: expected a list"),
        ({"version": "4", "alerts": [1]}, "alerts[0]: expected an object"),
        ({"version": "4", "alerts": [{**alert(), "status": "weird"}]}, "alerts[0].status"),
        ({"version": "4", "alerts": [{**alert(), "startsAt": "yesterday"}]}, "alerts[0].startsAt"),
        ({"version": "4", "alerts": [{**alert(), "labels": {"a": 1}}]}, "alerts[0].labels.a"),
    ],
)
def test_bad_payloads_name_the_field(body: object, message: str) -> None:
    with pytest.raises(PayloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        alerts_to_faults(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"version": st.sampled_from(["4", "3", 4]), "alerts": st.lists(json_values | st.just(alert()), max_size=3)}
    )
    | json_values
)
def test_any_json_is_converted_or_rejected_cleanly(body: object) -> None:
    try:
        result = alerts_to_faults(body)
    except PayloadError:
        return
    for fault in result.faults:
        assert fault["action"] in ("restart_app", "reset_gpu", "reboot_node", "replace_node")


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.faults: list[Mapping[str, Any]] = []
        self.fail = fail

    def report(self, fault: Mapping[str, Any]) -> None:
        if self.fail:
            raise ForwardError("hook down")
        self.faults.append(fault)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def server(recorder: Recorder) -> Iterator[AlertWebhookServer]:
    srv = AlertWebhookServer(("127.0.0.1", 0), recorder)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def post(srv: AlertWebhookServer, body: bytes, path: str = "/alertmanager") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_forwards_and_answers_200(server: AlertWebhookServer, recorder: Recorder) -> None:
    status, text = post(server, json.dumps(payload(alert(), alert(action="none"))).encode())
    assert status == 200, text
    assert "forwarded 1, skipped 1" in text
    assert [f["action"] for f in recorder.faults] == ["replace_node"]


def test_http_rejects_bad_input_with_4xx_and_keeps_serving(server: AlertWebhookServer, recorder: Recorder) -> None:
    assert post(server, b"{not json")[0] == 400
    assert post(server, json.dumps({"version": "1", "alerts": []}).encode())[0] == 400
    assert post(server, b"{}", path="/other")[0] == 404
    assert post(server, b" " * (1 << 20 + 1))[0] == 413
    assert post(server, json.dumps(payload(alert())).encode())[0] == 200
    assert len(recorder.faults) == 1


def test_http_answers_503_when_the_hook_fails_so_alertmanager_retries(
    server: AlertWebhookServer, recorder: Recorder
) -> None:
    recorder.fail = True
    status, text = post(server, json.dumps(payload(alert())).encode())
    assert status == 503 and "hook down" in text


def test_spool_forwarder_appends_json_lines(tmp_path: Path) -> None:
    forwarder = make_forwarder(None, tmp_path / "faults.jsonl", None)
    for fault in alerts_to_faults(payload(alert(), alert(gpu="5", fingerprint="x"))).faults:
        forwarder.report(fault)
    lines = [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [x["gpu_index"] for x in lines] == [3, 5]


def test_spool_in_a_missing_directory_is_a_forward_error(tmp_path: Path) -> None:
    forwarder = JsonLinesForwarder(tmp_path / "missing" / "faults.jsonl")
    with pytest.raises(ForwardError, match="cannot write"):
        forwarder.report({"fault_id": "x"})


def test_forwarder_choice_is_validated() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        make_forwarder(None, None, None)
    with pytest.raises(ValueError, match="no ReplacementHook client"):
        make_forwarder("unix:/tmp/hook.sock", None, None)
    made: list[str] = []

    def factory(address: str) -> Recorder:
        made.append(address)
        return Recorder()

    make_forwarder("unix:/tmp/hook.sock", None, factory)
    assert made == ["unix:/tmp/hook.sock"]
