"""One failed card, one node swap, with both hook channels on.

The daemon pushes its replace_node faults to the reference hook itself ([hook] endpoints), and Prometheus (shipped
rules) -> Alertmanager (shipped example routing) -> `xpuctl alert-webhook` delivers the alerts for them too. On one
card XID 79 comes first, then the driver reports the card lost (``gpu_lost``), as on real hardware: two faults, two
alerts (XpuFatalXid, XpuGpuFallenOffBus), four deliveries. The hook's command runs once: the alerts carry the
daemon's fault ids and node name (the same keys as the push), and the hook treats faults of one node, card and
action within its window as one condition.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.node_name import canonical_node_name
from tests.e2e.stack import Stack, missing_binaries, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"not installed: {missing_binaries()}"),
]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    runs = tmp_path / "swaps.log"
    s = Stack(tmp_path, hook_command=f'echo "$XPU_FAULT_ID $XPU_FAULT_CODE $XPU_NODE_NAME" >> {runs}').start()
    try:
        yield s
    finally:
        s.stop()


def _deliveries(stack: Stack) -> dict[str, int]:
    if not stack.hook_state.exists():
        return {}
    with sqlite3.connect(stack.hook_state) as db:
        return {str(k): int(n) for k, n in db.execute("SELECT fault_id, deliveries FROM executions")}


def xid_delivered(stack: Stack) -> bool:
    listed = stack.daemon.xpuctl("faults", "list", "--state", "active", "--gpu", "2", "--json")
    ids = (
        [f["id"] for f in json.loads(listed.stdout)["faults"] if f["code"] == "xid_79"]
        if listed.returncode == 0
        else []
    )
    return bool(ids) and _deliveries(stack).get(ids[0], 0) >= 1


def test_xid_79_then_gpu_lost_on_one_card_is_one_swap_with_both_channels_on(stack: Stack, tmp_path: Path) -> None:
    stack.inject("xid", 2, "code=79")
    # the card is lost only once the hook has the XID's fault (a fixed pause could end before the daemon read it)
    wait_for("the XID 79 fault delivered to the hook", lambda: xid_delivered(stack), timeout=60)
    stack.inject("gpu_lost", 2)

    def firing() -> set[str]:
        names = {a["labels"]["alertname"] for a in stack.am_alerts() if a["labels"].get("gpu") == "2"}
        return names if {"XpuFatalXid", "XpuGpuFallenOffBus"} <= names else set()

    wait_for("XpuFatalXid and XpuGpuFallenOffBus firing for GPU 2", firing, timeout=90)
    swaps = ("XpuFatalXid", "XpuGpuFallenOffBus")
    alerts = [a["labels"] for a in stack.am_alerts() if a["labels"].get("gpu") == "2"]
    faults = {a["alertname"]: a["fault_id"] for a in alerts if a["alertname"] in swaps}
    assert {a["node"] for a in alerts if a["alertname"] in swaps} == {canonical_node_name()}
    xid_fault, lost_fault = faults["XpuFatalXid"], faults["XpuGpuFallenOffBus"]
    assert xid_fault != lost_fault and xid_fault.startswith("flt-") and lost_fault.startswith("flt-")
    # each fault reached the hook on both channels: the daemon's push and the webhook, under the daemon's key
    wait_for(
        "both channels' deliveries of both faults",
        lambda: (d := _deliveries(stack)).get(xid_fault, 0) >= 2 and d.get(lost_fault, 0) >= 2,
        timeout=90,
    )
    assert set(_deliveries(stack)) == {xid_fault, lost_fault}, "no other identity (no alertmanager:... key)"
    runs = (tmp_path / "swaps.log").read_text().splitlines()
    assert len(runs) == 1, runs
    fault_id, code, node = runs[0].split()
    assert (fault_id, code) == (xid_fault, "xid_79"), "the first fault of the condition ran"
    with sqlite3.connect(stack.hook_state) as db:
        (outcome,) = db.execute("SELECT outcome FROM executions WHERE fault_id = ?", (lost_fault,)).fetchone()
    assert outcome.startswith(f"same condition as fault {xid_fault}"), outcome
    assert node == canonical_node_name()
