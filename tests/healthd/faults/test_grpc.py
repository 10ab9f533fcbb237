"""xpu.runtime.v1.Health over a real unix socket: WatchFaults replay + live + resume, ListFaults filters."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from healthd.findings import Action, Severity
from tests.support.faults_helpers import GPU0, GPU1, DaemonThread, ecc_finding, ecc_report, xid


def watch(address: str, after: int, count: int) -> list[Any]:
    """Read ``count`` items from a fresh WatchFaults call, then hang up (as a client that dies would)."""
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.HealthStub(channel).WatchFaults(pb.WatchFaultsRequest(after_seq=after), timeout=60)
        items = []
        for item in call:
            items.append(item)
            if len(items) == count:
                break
        call.cancel()
    return items


def test_watch_replays_then_streams_live_and_resumes_without_gap_or_duplicate(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "healthd.sock"
    with DaemonThread(tmp_path, sock) as d:
        for code in range(10, 15):
            d.engine.accept_event(xid(code))  # records 1..5 exist before anyone watches
        first = watch(d.address, 0, 3)
        assert [i.record.seq for i in first] == [1, 2, 3]
        for code in range(15, 20):
            d.engine.accept_event(xid(code))  # written while the client is away
        # resume with the last seq seen; more records arrive from another thread while it streams live
        feeder = threading.Thread(target=lambda: [d.engine.accept_event(xid(c, GPU1)) for c in range(20, 30)])
        with grpc.insecure_channel(d.address) as channel:
            call = pb_grpc.HealthStub(channel).WatchFaults(pb.WatchFaultsRequest(after_seq=3), timeout=60)
            second = []
            for item in call:
                second.append(item)
                if len(second) == 1:
                    feeder.start()
                if item.record.seq == 20:
                    break
            call.cancel()
        feeder.join()
        seqs = [i.record.seq for i in first + second]
        assert seqs == list(range(1, 21))
        assert second[-1].record.fault.gpu.uuid == GPU1.uuid
        assert second[-1].record.kind == "opened"
        # the standard gRPC health service runs beside ours under its own name
        with grpc.insecure_channel(d.address) as channel:
            std = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert std.status == health_pb2.HealthCheckResponse.SERVING


def test_watch_resumes_across_a_daemon_restart(tmp_path: Path) -> None:
    sock = tmp_path / "healthd.sock"
    with DaemonThread(tmp_path, sock) as d:
        for code in range(10, 14):
            d.engine.accept_event(xid(code))
        seen = [i.record.seq for i in watch(d.address, 0, 4)]
    with DaemonThread(tmp_path, sock) as d:  # same journal, new process state
        d.engine.accept_event(xid(99))
        seen += [i.record.seq for i in watch(d.address, seen[-1], 1)]
    assert seen == [1, 2, 3, 4, 5]


def test_watch_beyond_the_journal_is_out_of_range(tmp_path: Path) -> None:
    with DaemonThread(tmp_path, tmp_path / "s.sock") as d:
        d.engine.accept_event(xid(13))
        with pytest.raises(grpc.RpcError) as err:
            watch(d.address, 7, 1)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_watch_reports_a_gap_when_retention_removed_records(tmp_path: Path) -> None:
    with DaemonThread(tmp_path, tmp_path / "s.sock") as d:
        d.engine.accept_event(xid(13))
        d.engine.accept_event(xid(14))
        d.engine.journal.prune(10**12, 1, 10)  # every record is older than the retention
        d.engine.accept_event(xid(15))
        items = watch(d.address, 0, 2)
        assert items[0].WhichOneof("item") == "gap"
        assert (items[0].gap.from_seq, items[0].gap.to_seq) == (1, 2)
        assert items[1].record.seq == 3


def test_list_faults_filters_and_node_health(tmp_path: Path) -> None:
    with DaemonThread(tmp_path, tmp_path / "s.sock", open_after_evaluations=1, resolve_after_evaluations=1) as d:
        d.engine.accept_report(ecc_report(ecc_finding(GPU0)))
        d.engine.accept_event(xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        d.engine.accept_event(xid(13, GPU0))
        d.engine.accept_report(ecc_report())  # the ECC fault resolves
        with grpc.insecure_channel(d.address) as channel:
            stub = pb_grpc.HealthStub(channel)

            def codes(**kw: Any) -> list[str]:
                return [f.code for f in stub.ListFaults(pb.ListFaultsRequest(**kw), timeout=10).faults]

            assert codes() == ["xid_79", "xid_13", "ecc_uncorrectable_volatile"]  # by last change
            assert codes(gpu="1") == ["xid_79"]
            assert codes(gpu=GPU0.uuid) == ["xid_13", "ecc_uncorrectable_volatile"]
            assert codes(check="ecc") == ["ecc_uncorrectable_volatile"]
            assert codes(state="FAULT_STATE_RESOLVED") == ["ecc_uncorrectable_volatile"]
            assert codes(state="FAULT_STATE_ACTIVE", min_action="ACTION_REBOOT_NODE") == ["xid_79"]
            assert codes(min_severity="SEVERITY_FATAL") == ["xid_79"]
            assert codes(since_seq=3) == ["ecc_uncorrectable_volatile"]
            assert codes(limit=1) == ["xid_79"]
            health = stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=10)
            assert {(c.check, c.gpu.index, c.status) for c in health.checks} == {("ecc", 0, "ok"), ("ecc", 1, "ok")}
            assert sorted(f.code for f in health.active_faults) == ["xid_13", "xid_79"]
            assert health.last_seq == 4


TEXT = st.characters(blacklist_categories=("Cs",))
GPU_REF = re.compile(r"0*[0-9]{1,5}|(?i:gpu)-[0-9a-zA-Z_.-]{1,60}")  # ASCII digits or a UUID
HOSTILE_GPUS = ["٣", "²", "1" * 5000, "GPU-" + "a" * 20000]


def _list_request(draw: Any) -> Any:
    return pb.ListFaultsRequest(
        gpu=draw(
            st.one_of(st.sampled_from(["0", "1", "01", GPU0.uuid, "٣", "²", "1" * 5000]), st.text(TEXT, max_size=300))
        ),
        check=draw(st.one_of(st.just("xid"), st.text(TEXT, max_size=300))),
        state=draw(st.integers(-5, 5)),
        min_severity=draw(st.integers(-(2**31), 2**31 - 1)),
        min_action=draw(st.integers(-3, 9)),
        since_seq=draw(st.one_of(st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))),
        limit=draw(st.integers(0, 2**32 - 1)),
    )


def test_list_faults_any_input_is_an_answer_or_invalid_argument(tmp_path: Path) -> None:
    with DaemonThread(tmp_path, tmp_path / "s.sock") as d:
        d.engine.accept_event(xid(13))
        with grpc.insecure_channel(d.address) as channel:
            stub = pb_grpc.HealthStub(channel)

            @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
            @given(st.data())
            def check(data: st.DataObject) -> None:
                request = _list_request(data.draw)
                gpu, check = request.gpu.strip(" \t"), request.check
                valid = (
                    (not gpu or (bool(GPU_REF.fullmatch(gpu)) and len(gpu) <= 64))
                    and (not gpu.isdigit() or int(gpu) <= 65535)
                    and (
                        not check or (len(check) <= 64 and check.isascii() and check.isprintable() and " " not in check)
                    )
                    and 0 <= request.state <= 2
                    and 0 <= request.min_severity <= 4
                    and 0 <= request.min_action <= 5
                    and request.limit <= 10000
                )
                if not valid:
                    with pytest.raises(grpc.RpcError) as err:
                        stub.ListFaults(request, timeout=10)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert 0 < len(err.value.details()) < 1000  # never the whole input
                    return
                reply = stub.ListFaults(request, timeout=10)
                assert len(reply.faults) <= (request.limit or 1000)
                assert all(f.last_seq > request.since_seq for f in reply.faults)

            check()
            # and the daemon still answers afterwards
            assert len(stub.ListFaults(pb.ListFaultsRequest(), timeout=10).faults) == 1
