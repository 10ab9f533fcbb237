"""One card hung (or lost) from start-up: the daemon's Partitions API serves the seven others at once (modes, creates,
capacity, lease reclaim by the reconciler), answers UNAVAILABLE naming the hung card for it, and takes the card in
once it answers. Real daemon on the simulated node, real gRPC client on its admin socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.sampler import SamplerSettings
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config
from healthd.daemon.daemon import Daemon
from healthd.partition.settings import PartitionSettings


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return await check()


def lease(ttl: float = 0.0) -> Any:
    return pb.Owner(lease=pb.LeaseOwner(holder="t", ttl_seconds=ttl))


@pytest.mark.parametrize("call", ["*", "device_info", "nvlink_peers", "lost"])
def test_one_card_hung_from_start_up_leaves_the_others_partitionable(
    tmp_path: Path, call: str, simulated_config: Callable[[Config], Config]
) -> None:
    config = simulated_config(
        Config(
            sampler=SamplerSettings(interval_seconds=0.3, call_deadline_seconds=0.3, open_deadline_seconds=2.0),
            partitions=PartitionSettings(reconcile_interval_seconds=0.3),
        )
    )

    async def go() -> None:
        daemon = Daemon(config, allow_fallback=True)
        if call == "lost":  # fell off the bus before boot: every call answers GPU_IS_LOST
            daemon.backend.inject("gpu_lost", 3)
        else:
            daemon.backend.inject("hang", 3, {"call": call})
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                cards = (await stub.GetCapacity(pb.GetCapacityRequest(), timeout=10)).cards
                assert [c.gpu for c in cards] == [0, 1, 2, 4, 5, 6, 7]
                for gpu in ("0", "1"):
                    await stub.SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=pb.PARTITION_MODE_TDM), timeout=10)
                kept = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=lease(), gpu="0", compute_percent=20), timeout=10
                )
                assert kept.state == "ready" and kept.env["CUDA_VISIBLE_DEVICES"]
                short = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=lease(ttl=1), gpu="1", compute_percent=20), timeout=10
                )
                for request, method in (
                    (pb.SetCardModeRequest(gpu="3", mode=pb.PARTITION_MODE_TDM), stub.SetCardMode),
                    (pb.CreatePartitionRequest(owner=lease(), gpu="3", compute_percent=20), stub.CreatePartition),
                    (pb.GetCapacityRequest(gpu="3"), stub.GetCapacity),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await method(request, timeout=10)
                    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "GPU 3 has not answered" in (refused.value.details() or "")

                async def reclaimed() -> bool:  # the reconciler runs: the 1 s lease on GPU 1 is reclaimed
                    listed = await stub.ListPartitions(pb.ListPartitionsRequest(), timeout=10)
                    return [p.id for p in listed.partitions] == [kept.id]

                assert await eventually(reclaimed), f"lease of {short.id} was not reclaimed"
                daemon.backend.clear(3)

                async def joined() -> bool:
                    cards = (await stub.GetCapacity(pb.GetCapacityRequest(), timeout=10)).cards
                    return [c.gpu for c in cards] == list(range(8))

                assert await eventually(joined), "GPU 3 did not join once it answered"
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="3", mode=pb.PARTITION_MODE_TDM), timeout=10)
                made = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=lease(), gpu="3", compute_percent=20), timeout=10
                )
                assert made.state == "ready"
        finally:
            await daemon.stop()

    asyncio.run(go())
