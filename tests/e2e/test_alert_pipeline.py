"""XID faults through the whole path: the daemon's fault pipeline -> xpu_faults_active -> Prometheus (shipped rules)
-> Alertmanager (shipped example routing) -> webhook receiver -> the hook.

The XID catalog asks for replace_node on XID 79 (NVIDIA's bucket is RESTART_BM: with a standby pool the node is
swapped out and rebooted in repair); application XIDs stay capped at restart_app whatever the config says.

Expected:
- ``xpuctl simulate inject xid --gpu 2 code=79`` opens fault ``xid_79`` with action replace_node, so
  ``xpu_faults_active{code="xid_79",action="replace_node"}`` is 1; XpuFatalXid fires and the hook receives a
  FaultReport with code ``xid_79``, action ``replace_node``, the daemon's own fault id as its idempotency key and
  the daemon's canonical node name: the same key and node as the daemon's own push of that fault.
- ``... inject xid --gpu 4 code=13`` opens ``xid_13`` with action restart_app: XpuApplicationXid fires and reaches
  Alertmanager (receiver ops only); the hook never receives an ``xid_13`` fault and no replace_node alert names it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from healthd.node_name import canonical_node_name
from tests.e2e.stack import ROOT, Stack, missing_binaries, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"not installed: {missing_binaries()}"),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("pipeline")).start()
    try:
        assert "# TYPE xpu_faults_active " in s.daemon.metrics()
        s.inject("xid", 2, "code=79")
        s.inject("xid", 4, "code=13")
        yield s
    finally:
        s.stop()


def test_xid_79_ends_as_a_replace_node_fault_at_the_hook(stack: Stack) -> None:
    def delivered() -> list[dict[str, object]]:
        return [f for f in stack.hook_faults() if f["code"] == "xid_79"]

    (fault, *_) = wait_for("xid_79 delivered to the hook", delivered, timeout=60)
    assert fault["action"] == "replace_node"
    assert fault["node_name"] == canonical_node_name()
    assert fault["evidence"]["label.alertname"] == "XpuFatalXid"  # type: ignore[index]
    # one identity on both channels: the daemon's push of the same fault has the same key and node
    (pushed,) = [f for f in stack.hook_faults(source="daemon") if f["code"] == "xid_79"]
    assert (fault["idempotency_key"], fault["node_name"]) == (pushed["idempotency_key"], pushed["node_name"])
    assert fault["duplicate"] != pushed["duplicate"], "whichever came second was a duplicate for the hook"


def test_xid_79_also_reaches_the_hook_from_the_daemon_outbox(stack: Stack) -> None:
    """The daemon pushes replace_node faults to its configured hook itself, without waiting for Alertmanager."""

    def delivered() -> list[dict[str, object]]:
        return [f for f in stack.hook_faults(source="daemon") if f["code"] == "xid_79"]

    (fault, *_) = wait_for("xid_79 from the daemon's outbox", delivered, timeout=60)
    assert fault["action"] == "replace_node"
    assert fault["gpu_index"] == 2
    assert fault["idempotency_key"] == fault["fault_id"]
    assert not [f for f in stack.hook_faults(source="daemon") if f["code"] == "xid_13"]


def test_application_xid_alerts_operators_but_never_reaches_the_hook(stack: Stack) -> None:
    def app_alert() -> list[dict[str, object]]:
        return [a for a in stack.am_alerts() if a["labels"].get("code") == "xid_13"]

    alerts = wait_for("XpuApplicationXid in Alertmanager", app_alert, timeout=60)
    assert {a["labels"]["alertname"] for a in alerts} == {"XpuApplicationXid"}  # type: ignore[index]
    assert all(a["labels"]["action"] == "restart_app" for a in alerts)  # type: ignore[index]
    assert all([r["name"] for r in a["receivers"]] == ["ops"] for a in alerts)  # type: ignore[attr-defined]
    # by now the xid_79 fault, injected at the same time, has been delivered; xid_13 must not be among them
    wait_for("xid_79 delivered", lambda: [f for f in stack.hook_faults() if f["code"] == "xid_79"], timeout=60)
    assert not [f for f in stack.hook_faults() if f["code"] == "xid_13"]
    assert {f["action"] for f in stack.hook_faults()} == {"replace_node"}


# ---- the health dashboard's per-card fault table, on the live Prometheus ----


def _health_panel_queries(title: str, instance: str) -> list[str]:
    dashboard = json.loads((ROOT / "dashboards" / "xpu-health.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"] == title]
    values = {"$__range": "5m", "$node": instance, "$gpu": ".*"}
    out = []
    for target in panel["targets"]:
        expr = target["expr"]
        for var, value in values.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        out.append(expr)
    return out


def test_faults_per_card_panel_names_gpu_2_with_code_and_action(stack: Stack) -> None:
    active, since = _health_panel_queries("Faults per card", stack.instance)

    def xid_79_row() -> list[dict[str, Any]]:
        return [r for r in stack.query(active) if r["metric"].get("code") == "xid_79"]

    (row,) = wait_for("the XID 79 row of the per-card fault table", xid_79_row, timeout=30)
    assert row["metric"]["gpu"] == "2" and row["metric"]["action"] == "replace_node"
    assert row["metric"]["uuid"].startswith("GPU-") and row["metric"]["severity"] == "fatal"
    rows = {r["metric"].get("code"): r["metric"].get("gpu") for r in stack.query(active)}
    assert rows.get("xid_13") == "4"  # the application XID is on its own card's row
    # the Since column: the same series, with when it was first active (milliseconds since the epoch)
    (first,) = [r for r in stack.query(since) if r["metric"].get("code") == "xid_79"]
    assert first["metric"]["gpu"] == "2"
    assert 0 < time.time() * 1000 - float(first["value"][1]) < 10 * 60 * 1000
