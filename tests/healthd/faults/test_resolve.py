"""Health.ResolveFault: an operator resolves a fault after a repair; admin socket only; journaled and streamed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from healthd.faults import service as health_service
from healthd.faults.fault import FaultState
from healthd.findings import Action, Severity
from healthd.rpc.server import GrpcServer, Service
from tests.support.clock import FakeClock
from tests.support.faults_helpers import GPU0, GPU1, DaemonThread, ecc_finding, ecc_report, make_engine, xid


def test_engine_resolves_an_active_fault_and_journals_the_reason(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    opened = engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REPLACE_NODE))[0]
    assert engine.tick() == []  # replace_node never resolves by itself
    clock.advance(5)
    record = engine.resolve_by_operator(opened.fault.id, "card replaced, ticket 42")
    assert record is not None
    assert record.kind == "resolved"
    assert record.detail == "operator: card replaced, ticket 42"
    assert record.fault.state is FaultState.RESOLVED
    assert record.fault.resolved_at == clock.now
    assert engine.active_faults() == []
    assert engine.resolve_by_operator(opened.fault.id, "again") is None  # no longer active
    assert engine.resolve_by_operator("no-such-id", "x") is None
    # the journal holds it: a new engine over the same file starts with nothing active
    assert make_engine(tmp_path, clock).active_faults() == []


def test_a_condition_still_present_reopens_the_same_fault(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = make_engine(tmp_path, clock)
    finding = ecc_finding(GPU1)
    engine.accept_report(ecc_report(finding))
    fault = engine.accept_report(ecc_report(finding))[0].fault
    engine.resolve_by_operator(fault.id, "reseated")
    clock.advance(10)
    again = engine.accept_report(ecc_report(finding))
    assert [r.kind for r in again] == ["reopened"]
    assert again[0].fault.id == fault.id


def test_resolve_is_refused_on_the_monitoring_socket_and_served_on_the_admin_socket(tmp_path: Path) -> None:
    admin_sock = tmp_path / "run" / "healthd-admin.sock"
    with DaemonThread(tmp_path, tmp_path / "run" / "healthd.sock") as d:
        admin = GrpcServer(
            [f"unix:{admin_sock}"],
            [Service(health_service.SERVICE_NAME, d.health.admin_service, health_service.add_to_server)],
            socket_mode=0o600,
        )
        asyncio.run_coroutine_threadsafe(admin.start(), d.loop).result(30)
        try:
            opened = d.engine.accept_event(xid(79, GPU0, severity=Severity.FATAL, action=Action.REPLACE_NODE))[0]
            with grpc.insecure_channel(d.address) as channel:
                stub = pb_grpc.HealthStub(channel)
                with pytest.raises(grpc.RpcError) as denied:
                    stub.ResolveFault(pb.ResolveFaultRequest(id=opened.fault.id, reason="fixed"), timeout=10)
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with grpc.insecure_channel(f"unix:{admin_sock}") as channel:
                stub = pb_grpc.HealthStub(channel)
                for request, code in [
                    (pb.ResolveFaultRequest(id=opened.fault.id, reason="  "), grpc.StatusCode.INVALID_ARGUMENT),
                    (pb.ResolveFaultRequest(reason="fixed"), grpc.StatusCode.INVALID_ARGUMENT),
                    (pb.ResolveFaultRequest(id=opened.fault.id, reason="x" * 513), grpc.StatusCode.INVALID_ARGUMENT),
                    (pb.ResolveFaultRequest(id="f-unknown", reason="fixed"), grpc.StatusCode.NOT_FOUND),
                ]:
                    with pytest.raises(grpc.RpcError) as bad:
                        stub.ResolveFault(request, timeout=10)
                    assert bad.value.code() == code
                reply = stub.ResolveFault(
                    pb.ResolveFaultRequest(id=opened.fault.id, reason="GPU 0 reseated"), timeout=10
                )
                assert reply.record.kind == "resolved"
                assert reply.record.detail == "operator: GPU 0 reseated"
                assert reply.record.fault.state == pb.FAULT_STATE_RESOLVED
                with pytest.raises(grpc.RpcError) as twice:
                    stub.ResolveFault(pb.ResolveFaultRequest(id=opened.fault.id, reason="again"), timeout=10)
                assert twice.value.code() == grpc.StatusCode.NOT_FOUND
            # the watch stream carries the resolve like any other record
            with grpc.insecure_channel(d.address) as channel:
                call = pb_grpc.HealthStub(channel).WatchFaults(pb.WatchFaultsRequest(after_seq=0), timeout=30)
                items = []
                for item in call:
                    items.append(item.record)
                    if len(items) == 2:
                        break
                call.cancel()
            assert [(r.kind, r.fault.id) for r in items] == [("opened", opened.fault.id), ("resolved", opened.fault.id)]
            assert items[1].detail == "operator: GPU 0 reseated"
        finally:
            asyncio.run_coroutine_threadsafe(admin.stop(0.5), d.loop).result(30)
