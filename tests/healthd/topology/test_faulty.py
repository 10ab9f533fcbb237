"""Topology.PreferredAllocation leaves out cards with faults that take them out of service, unless asked."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest

from exporter.topology.refresher import RefreshStatus
from healthd.api.v1 import topology_pb2 as pb
from healthd.api.v1 import topology_pb2_grpc as pb_grpc
from healthd.rpc.server import GrpcServer, Service
from healthd.topology.component import _add_topology
from healthd.topology.service import TopologyService
from tests.support.topology_fixtures import fixture_topology


def test_faulty_cards_are_left_out(tmp_path: Path) -> None:
    topology = fixture_topology("hgx_nvswitch")
    faulty: set[int] = {2}
    status = RefreshStatus(1, 1, 0, "", None)
    service = TopologyService(lambda: topology, lambda: status, lambda: frozenset(faulty))
    address = f"unix:{tmp_path}/t.sock"
    server = GrpcServer([address], [Service("xpu.runtime.v1.Topology", service, _add_topology)])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.TopologyStub(channel)
            # unfaulted, the best 4 of this node are 0-3 (NUMA node 0); with GPU 2 faulty, the other NUMA node's
            clean = stub.PreferredAllocation(pb.PreferredAllocationRequest(count=4, include_faulty_gpus=True))
            assert list(clean.gpus) == [0, 1, 2, 3]
            assert list(clean.excluded_faulty_gpus) == []
            reply = stub.PreferredAllocation(pb.PreferredAllocationRequest(count=4))
            assert list(reply.gpus) == [4, 5, 6, 7]
            assert list(reply.excluded_faulty_gpus) == [2]
            listed = stub.PreferredAllocation(
                pb.PreferredAllocationRequest(count=2, available=["0", "1", "2", "3"]), timeout=10
            )
            assert 2 not in listed.gpus and list(listed.excluded_faulty_gpus) == [2]
            for request, code in [
                (pb.PreferredAllocationRequest(count=1, must_include=["2"]), grpc.StatusCode.FAILED_PRECONDITION),
                (pb.PreferredAllocationRequest(count=8), grpc.StatusCode.RESOURCE_EXHAUSTED),
                (
                    pb.PreferredAllocationRequest(count=2, available=["2", "3"]),
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ),
            ]:
                with pytest.raises(grpc.RpcError) as err:
                    stub.PreferredAllocation(request, timeout=10)
                assert err.value.code() == code
                assert "fault" in err.value.details()
            faulty.clear()
            again = stub.PreferredAllocation(pb.PreferredAllocationRequest(count=4), timeout=10)
            assert list(again.gpus) == [0, 1, 2, 3]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0.1), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
