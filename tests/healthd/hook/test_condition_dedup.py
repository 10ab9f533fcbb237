"""The reference hook runs its command once per node, card and action within its window, whatever the fault id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import hook_pb2 as hpb
from healthd.api.v1 import hook_pb2_grpc as hpb_grpc
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until


class Hook:
    def __init__(self, tmp: Path, *extra: str) -> None:
        self.socket = tmp / "hook.sock"
        self.runs = tmp / "runs.log"
        self.fail = tmp / "fail"  # while it exists the command fails
        command = f'echo "$XPU_FAULT_ID" >> {self.runs}; [ ! -e {self.fail} ]'
        self.proc = start_hook(f"unix:{self.socket}", command, tmp / "hook.sqlite", extra=extra)
        wait_until(self.socket.exists, "the hook's socket")

    def report(self, key: str, *, node: str = "gpu-node-7", uuid: str = "GPU-2", action: str = "replace_node") -> str:
        request = hpb.FaultReport(
            idempotency_key=key, fault_id=key, node_name=node, gpu_uuid=uuid, gpu_index=2, action=action
        )
        with grpc.insecure_channel(f"unix:{self.socket}") as channel:
            try:
                ack = hpb_grpc.ReplacementHookStub(channel).ReportFault(request, timeout=30)
            except grpc.RpcError as exc:
                return f"error {exc.code().name}"
        return "duplicate" if ack.duplicate else "ran"

    def ran(self) -> list[str]:
        return self.runs.read_text().split() if self.runs.exists() else []


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Hook]:
    h = Hook(tmp_path)
    yield h
    stop_hook(h.proc)


def test_faults_of_one_node_card_and_action_run_once(hook: Hook) -> None:
    assert hook.report("flt-xid79") == "ran"
    assert hook.report("flt-gpu-lost") == "duplicate", "gpu_lost after XID 79 on the same card: the same swap"
    assert hook.report("flt-gpu-lost") == "duplicate", "and so is its redelivery"
    assert hook.report("flt-xid79-node-b", node="GPU-Node-8") == "ran", "another node"
    assert hook.report("flt-xid79-node-b2", node="gpu-node-8") == "duplicate", "node names compare lower-cased"
    assert hook.report("flt-card5", uuid="GPU-5") == "ran", "another card"
    assert hook.report("flt-reset", action="reset_gpu") == "ran", "another action"
    assert hook.ran() == ["flt-xid79", "flt-xid79-node-b", "flt-card5", "flt-reset"]


def test_a_failed_command_does_not_stand_for_its_condition(hook: Hook) -> None:
    hook.fail.touch()
    assert hook.report("flt-a") == "error UNAVAILABLE"
    hook.fail.unlink()
    assert hook.report("flt-b") == "ran", "the first run failed: the next fault of the condition runs again"
    assert hook.report("flt-a") == "duplicate"
    assert hook.ran() == ["flt-a", "flt-b"]


def test_a_zero_window_turns_the_condition_dedup_off(tmp_path: Path) -> None:
    h = Hook(tmp_path, "--dedup-window", "0")
    try:
        assert [h.report("flt-a"), h.report("flt-b"), h.report("flt-a")] == ["ran", "ran", "duplicate"]
    finally:
        stop_hook(h.proc)
