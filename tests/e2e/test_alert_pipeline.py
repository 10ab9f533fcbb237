"""XID faults through the whole path: the daemon's fault pipeline -> xpu_faults_active -> Prometheus (shipped rules)
-> Alertmanager (shipped example routing) -> webhook receiver -> the hook.

The XID catalog asks for replace_node on XID 79 (NVIDIA's bucket is RESTART_BM: with a standby pool the node is
swapped out and rebooted in repair); application XIDs stay capped at restart_app whatever the config says.

Expected:
- ``xpuctl simulate inject xid --gpu 2 code=79`` opens fault ``xid_79`` with action replace_node, so
  ``xpu_faults_active{code="xid_79",action="replace_node"}`` is 1; XpuFatalXid fires and the hook receives a
  FaultReport with code ``xid_79``, action ``replace_node``, node ``127.0.0.1``.
- ``... inject xid --gpu 4 code=13`` opens ``xid_13`` with action restart_app: XpuApplicationXid fires and reaches
  Alertmanager (receiver ops only); the hook never receives an ``xid_13`` fault and no replace_node alert names it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.stack import Stack, missing_binaries, wait_for

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
    assert fault["node_name"] == "127.0.0.1"
    assert fault["evidence"]["label.alertname"] == "XpuFatalXid"  # type: ignore[index]


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
