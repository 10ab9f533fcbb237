"""A node where one card does not answer: the inventory serves the others, and the card joins when it answers.

xpu-healthd's simulated node cannot be put into this state from outside (a card hung before the partition service
started), so a small servicer on a real gRPC server answers as the daemon's public API does then: the node-wide
GetCapacity is UNAVAILABLE while each ready card answers alone (``GetCapacityRequest.gpu``), and the topology lists
every card. It proves the plugin's side only; the daemon's side is tested with the daemon.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from container.core.daemon_client import DaemonClient
from container.core.inventory import Inventory
from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from healthd.api.v1 import topology_pb2 as tpb
from healthd.api.v1 import topology_pb2_grpc as tpb_grpc

UUIDS = [f"GPU-{i}" for i in range(4)]


class _Node:
    def __init__(self) -> None:
        self.hung = {"GPU-3"}

    def card(self, uuid: str) -> ppb.CardCapacity:
        return ppb.CardCapacity(gpu=UUIDS.index(uuid), gpu_uuid=uuid, memory_total_bytes=143_771 * 2**20)


class _Partitions(ppb_grpc.PartitionsServicer):
    def __init__(self, node: _Node) -> None:
        self._n = node

    async def GetCapacity(self, request: Any, context: Any) -> Any:
        if not request.gpu and self._n.hung:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "partitions are not serving yet")
        if request.gpu in self._n.hung:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{request.gpu} has not answered")
        wanted = [request.gpu] if request.gpu else UUIDS
        return ppb.GetCapacityResponse(cards=[self._n.card(u) for u in wanted])

    async def ListPartitions(self, request: Any, context: Any) -> Any:
        return ppb.ListPartitionsResponse()


class _Topology(tpb_grpc.TopologyServicer):
    async def Get(self, request: Any, context: Any) -> Any:
        return tpb.GetTopologyResponse(gpus=[tpb.TopologyGpu(index=i, uuid=u) for i, u in enumerate(UUIDS)])


def test_the_cards_that_answer_are_served_and_the_hung_one_joins_later(tmp_path: Path) -> None:
    async def go() -> None:
        node = _Node()
        server = grpc.aio.server()
        ppb_grpc.add_PartitionsServicer_to_server(_Partitions(node), server)
        tpb_grpc.add_TopologyServicer_to_server(_Topology(), server)
        address = f"unix:{tmp_path / 'd.sock'}"
        server.add_insecure_port(address)
        await server.start()
        client = DaemonClient(address, address, timeout=5)
        try:
            inventory = Inventory(client)
            assert await inventory.refresh()
            assert [c.uuid for c in inventory.view.cards] == UUIDS[:3]
            assert inventory.unanswered == ("GPU-3",)
            node.hung.clear()
            assert await inventory.refresh()
            assert [c.uuid for c in inventory.view.cards] == UUIDS
            assert inventory.unanswered == ()
            node.hung = set(UUIDS)  # no card answers: an error, and the last view stays
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await inventory.refresh()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert [c.uuid for c in inventory.view.cards] == UUIDS
        finally:
            await client.close()
            await server.stop(0)

    asyncio.run(go())
