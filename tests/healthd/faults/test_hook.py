"""Hook outbox end to end: daemon pipeline -> ReplacementHook -> reference hook server (`xpuctl hook serve`).

The hook is down while faults happen, comes up later (as a separate process), fails each fault's command once,
and still ends with every fault executed exactly once, in sequence order.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import hook_pb2 as hpb
from healthd.api.v1 import hook_pb2_grpc as hpb_grpc
from healthd.faults.fault import FaultFilter
from healthd.faults.settings import HookSettings
from healthd.findings import Action, Severity
from tests.support.faults_helpers import GPU0, GPU1, DaemonThread, xid
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until


def test_hook_down_then_up_gets_every_fault_once_in_order(tmp_path: Path) -> None:
    hook_sock = tmp_path / "hook" / "hook.sock"
    executed = tmp_path / "executed.txt"
    payloads = tmp_path / "payloads.jsonl"
    marks = tmp_path / "marks"
    marks.mkdir()
    # the operator's command: fails the first time it sees a fault id, succeeds (and records) the second time
    command = (
        f'if [ ! -e {marks}/"$XPU_FAULT_ID" ]; then touch {marks}/"$XPU_FAULT_ID"; echo "swap API busy"; exit 3; fi; '
        f'cat >> {payloads}; echo "$XPU_FAULT_ID" >> {executed}'
    )
    hook = HookSettings(
        endpoints=(f"unix:{hook_sock}",),
        min_action="reboot_node",
        node_name="gpu-node-7",
        timeout_seconds=30.0,
        backoff_initial_seconds=0.02,
        backoff_max_seconds=0.2,
    )
    with DaemonThread(tmp_path / "state", tmp_path / "healthd.sock", hook=hook) as d:
        fatal = {"severity": Severity.FATAL, "action": Action.REBOOT_NODE}
        for code in (79, 48, 64, 94, 95, 119):
            d.engine.accept_event(xid(code, GPU0, **fatal))
            d.engine.accept_event(xid(code, GPU1, **fatal))
            d.engine.accept_event(xid(code, GPU1, **fatal))  # a repeat: same fault, not a second delivery
        d.engine.accept_event(xid(13, GPU0))  # restart_app: below the hook's level, never delivered
        expected = [f.id for f in d.engine.journal.list_faults(FaultFilter(min_action=Action.REBOOT_NODE, limit=100))]
        assert len(expected) == 12
        target = hook.endpoints[0]
        wait_until(lambda: d.health.dispatcher.failures[target] >= 5, "deliveries to fail while the hook is down")
        assert d.engine.journal.outbox_depth() == {target: 12}

        # one command per fault id here (several faults per card: the per-condition dedup is tested on its own)
        proc = start_hook(f"unix:{hook_sock}", command, tmp_path / "hook-state.sqlite", extra=("--dedup-window", "0"))
        try:
            wait_until(lambda: d.engine.journal.outbox_depth() == {}, "the outbox to drain", limit=120)
            ids = executed.read_text().split()
            assert ids == expected  # every fault, in sequence order, each executed once
            docs = [json.loads(line) for line in payloads.read_text().splitlines()]
            assert [doc["idempotency_key"] for doc in docs] == expected
            assert {doc["node_name"] for doc in docs} == {"gpu-node-7"}
            assert docs[0]["fault"]["code"] == "xid_79"
            assert docs[0]["fault"]["action"] == "reboot_node"
            assert docs[1]["fault"]["gpu"]["uuid"] == GPU1.uuid
            # a redelivery of a handled id (e.g. the daemon died before recording the ack) runs nothing
            with grpc.insecure_channel(f"unix:{hook_sock}") as channel:
                ack = hpb_grpc.ReplacementHookStub(channel).ReportFault(
                    hpb.FaultReport(idempotency_key=expected[0], fault_id=expected[0]), timeout=10
                )
            assert ack.duplicate
        finally:
            stop_hook(proc)
    assert executed.read_text().split() == expected
    # the hook remembers across its own restart
    proc = start_hook(f"unix:{hook_sock}", command, tmp_path / "hook-state.sqlite")
    try:

        def ack_for(key: str) -> bool:
            try:
                with grpc.insecure_channel(f"unix:{hook_sock}") as channel:
                    stub = hpb_grpc.ReplacementHookStub(channel)
                    return bool(stub.ReportFault(hpb.FaultReport(idempotency_key=key), timeout=5).duplicate)
            except grpc.RpcError:
                return False

        wait_until(lambda: ack_for(expected[-1]), "the restarted hook to answer")
    finally:
        stop_hook(proc)
    assert executed.read_text().split() == expected


def test_outbox_survives_a_daemon_restart(tmp_path: Path) -> None:
    hook = HookSettings(endpoints=("unix:/nonexistent/hook.sock",), min_action="reboot_node",
                        backoff_initial_seconds=0.02, backoff_max_seconds=0.05)  # fmt: skip
    with DaemonThread(tmp_path, tmp_path / "a.sock", hook=hook) as d:
        d.engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        wait_until(lambda: d.health.dispatcher.failures[hook.endpoints[0]] >= 1, "a failed delivery")
    with DaemonThread(tmp_path, tmp_path / "a.sock", hook=hook) as d:
        head = d.engine.journal.outbox_head(hook.endpoints[0])
        assert head is not None
        assert head.attempts >= 1
        assert "UNAVAILABLE" in head.last_error


def test_hook_rejects_a_report_without_a_key(tmp_path: Path) -> None:
    sock = tmp_path / "hook.sock"
    proc = start_hook(f"unix:{sock}", "true", tmp_path / "h.sqlite")
    try:

        def code() -> grpc.StatusCode | None:
            try:
                with grpc.insecure_channel(f"unix:{sock}") as channel:
                    hpb_grpc.ReplacementHookStub(channel).ReportFault(hpb.FaultReport(), timeout=5)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        wait_until(lambda: code() == grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT for an empty key")
    finally:
        stop_hook(proc)


def test_hook_answers_any_report_with_ok_or_invalid_argument(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sock = tmp_path / "hook.sock"
    ran = tmp_path / "ran.txt"
    proc = start_hook(f"unix:{sock}", f'cat > /dev/null; echo "$XPU_FAULT_ID" >> {ran}', tmp_path / "h.sqlite")
    text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = hpb_grpc.ReplacementHookStub(channel)

            @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
            @given(
                key=st.one_of(st.just(""), text),
                node_name=text,
                seq=st.one_of(st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)),
                fault_json=st.one_of(st.sampled_from(["", "{", "[" * 100000, '"a"', "[]"]), text),
                gpu_index=st.one_of(st.integers(-2, 8), st.integers(-(2**31), 2**31 - 1)),
                message=text,
            )
            def check(key: str, node_name: str, seq: int, fault_json: str, gpu_index: int, message: str) -> None:
                request = hpb.FaultReport(
                    idempotency_key=key, node_name=node_name, seq=seq, fault_json=fault_json,
                    gpu_index=gpu_index, message=message,
                )  # fmt: skip
                valid = (
                    0 < len(key) <= 256
                    and key.isprintable()
                    and seq < 2**63
                    and len(node_name) <= 1024
                    and node_name.isprintable()
                    and gpu_index >= -1
                )
                if not valid:
                    with pytest.raises(grpc.RpcError) as err:
                        stub.ReportFault(request, timeout=30)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert len(err.value.details()) < 1000
                    return
                stub.ReportFault(request, timeout=30)

            check()
    finally:
        stop_hook(proc)
    lines = ran.read_bytes().split(b"\n") if ran.exists() else []
    ids = [ln for ln in lines if ln]
    assert len(ids) == len(set(ids))  # each accepted key ran once, however often hypothesis repeated it
