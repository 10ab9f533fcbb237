"""Every Partitions RPC checks in one order, whatever the call: a change on the read-only socket is PERMISSION_DENIED,
then a malformed request is INVALID_ARGUMENT even while the partitions are not serving yet, and only then does a
well-formed one meet UNAVAILABLE (PARTITIONS_STARTING). Served over real gRPC by a manager that was never started."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from exporter.backends.simulated import SimulatedBackend
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.partition.cdi import CdiWriter
from healthd.partition.component import SERVICE_NAME, add_partitions
from healthd.partition.manager import PartitionManager
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.service import PartitionsService
from healthd.partition.store import Store
from healthd.rpc.server import GrpcServer, Service

LEASE = pb.Owner(lease=pb.LeaseOwner(holder="t"))
# method, a well-formed request, a malformed one (and the field it names), whether it changes partitions
CALLS: list[tuple[str, Any, Any, str, bool]] = [
    ("SetCardMode", pb.SetCardModeRequest(gpu="1", mode=pb.PARTITION_MODE_TDM), pb.SetCardModeRequest(gpu="x"), "gpu",
     True),
    ("CreatePartition", pb.CreatePartitionRequest(gpu="any", owner=LEASE), pb.CreatePartitionRequest(gpu="any"),
     "owner", True),
    ("GetPartition", pb.GetPartitionRequest(id="p-0123456789ab"), pb.GetPartitionRequest(), "id", False),
    ("ListPartitions", pb.ListPartitionsRequest(), pb.ListPartitionsRequest(gpu="²"), "gpu", False),
    ("DeletePartition", pb.DeletePartitionRequest(id="p-0123456789ab"), pb.DeletePartitionRequest(), "id", True),
    ("RenewLease", pb.RenewLeaseRequest(id="p-0123456789ab", ttl_seconds=60), pb.RenewLeaseRequest(id="p-1",
     ttl_seconds=-1), "ttl_seconds", True),
    ("GetCapacity", pb.GetCapacityRequest(gpu="0"), pb.GetCapacityRequest(gpu="gpu0"), "gpu", False),
]  # fmt: skip


@pytest.fixture(scope="module")
def sockets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    root = Path(tmp_path_factory.mktemp("order"))
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    manager = PartitionManager(  # never started: not ready
        backend,
        Store(root / "state.sqlite"),
        MpsSupervisor(SimulatedMpsControl(), root / "run"),
        CdiWriter(root / "cdi"),
        OwnerProbe(cgroup_root=root / "cg", clock=lambda: 0.0),
        clock=lambda: 0.0,
    )
    servers = [
        GrpcServer(
            [f"unix:{root}/{name}.sock"],
            [Service(SERVICE_NAME, PartitionsService(manager, writable=writable), add_partitions)],
        )
        for name, writable in (("admin", True), ("read", False))
    ]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    yield f"unix:{root}/admin.sock", f"unix:{root}/read.sock"
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
    manager.store.close()


def answer(address: str, method: str, request: Any) -> tuple[grpc.StatusCode, str, str]:
    """(code, ErrorInfo reason, the first BadRequest field) of one call."""
    from google.rpc import error_details_pb2

    with grpc.insecure_channel(address) as channel:
        try:
            getattr(pb_grpc.PartitionsStub(channel), method)(request, timeout=20)
        except grpc.RpcError as exc:
            status = rpc_status.from_call(exc)  # type: ignore[arg-type]
            assert status is not None
            reason, field = "", ""
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason = info.reason
                elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    bad = error_details_pb2.BadRequest()
                    detail.Unpack(bad)
                    field = bad.field_violations[0].field
            return exc.code(), reason, field  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, "", ""


@pytest.mark.parametrize(("method", "good", "bad", "field", "writes"), CALLS, ids=[c[0] for c in CALLS])
def test_each_rpc_checks_the_socket_then_the_request_then_readiness(
    sockets: tuple[str, str], method: str, good: Any, bad: Any, field: str, writes: bool
) -> None:
    admin, read = sockets
    if writes:
        assert answer(read, method, bad) == (grpc.StatusCode.PERMISSION_DENIED, "READ_ONLY_SOCKET", "")
        assert answer(read, method, good) == (grpc.StatusCode.PERMISSION_DENIED, "READ_ONLY_SOCKET", "")
    for address in (admin,) if writes else (admin, read):
        assert answer(address, method, bad) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", field)
        assert answer(address, method, good) == (grpc.StatusCode.UNAVAILABLE, "PARTITIONS_STARTING", "")
