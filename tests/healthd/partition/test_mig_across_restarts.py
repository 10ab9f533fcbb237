"""The simulated driver keeps MIG instances across a daemon restart, as a real one does, so the daemon that comes
back adopts its MIG partitions (same instance, same UUID, same CDI device) and sees an operator's instance as
foreign. Two real daemons in turn on one state directory, driven through the admin socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc

from exporter.sampler import SamplerSettings
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config, with_overrides
from healthd.daemon.daemon import Daemon


def test_mig_partitions_are_adopted_after_a_restart(tmp_path: Path) -> None:
    config = with_overrides(
        Config(sampler=SamplerSettings(interval_seconds=0.5)),
        simulate="h200x8",
        metrics_listen="127.0.0.1:0",
        grpc_listen=(f"unix:{tmp_path}/h.sock",),
        state_dir=tmp_path / "state",
    )
    spec = tmp_path / "state" / "cdi" / "xpu-runtime-kit.io-gpu.json"
    lease = pb.Owner(lease=pb.LeaseOwner(holder="t", ttl_seconds=3600))

    async def first_run() -> list[pb.Partition]:
        daemon = Daemon(config, allow_fallback=True)
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=10)
                made = [
                    await stub.CreatePartition(
                        pb.CreatePartitionRequest(owner=lease, gpu="6", compute_percent=percent), timeout=10
                    )
                    for percent in (10, 10, 25)
                ]
                await stub.DeletePartition(pb.DeletePartitionRequest(id=made[0].id), timeout=10)  # a gap in the ids
            foreign = daemon.backend.create_mig_instance(7, 19, 6)  # an operator's, beside the scenario's two
            assert foreign.parent_index == 7
            return made[1:]
        finally:
            await daemon.stop()

    async def second_run(kept: list[pb.Partition]) -> None:
        daemon = Daemon(config, allow_fallback=True)  # a fresh simulated driver, as after a daemon restart
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                listed = (await stub.ListPartitions(pb.ListPartitionsRequest(), timeout=10)).partitions
                assert [(p.id, p.state, p.mig.uuid, p.mig.gpu_instance_id) for p in listed] == [
                    (p.id, "ready", p.mig.uuid, p.mig.gpu_instance_id) for p in kept
                ]
                assert [p.env["CUDA_VISIBLE_DEVICES"] for p in listed] == [p.mig.uuid for p in kept]
                cards = {c.gpu: c for c in (await stub.GetCapacity(pb.GetCapacityRequest(), timeout=10)).cards}
                assert len(cards[6].foreign_mig_instances) == 0, "our own instances are adopted, not foreign"
                assert len(cards[7].foreign_mig_instances) == 3
                names = {d["name"] for d in json.loads(spec.read_text())["devices"]}
                assert {p.id for p in kept} <= names
                await stub.DeletePartition(pb.DeletePartitionRequest(id=kept[0].id), timeout=10)
            assert [i.gpu_instance_id for i in daemon.backend.mig_instances(6)] == [kept[1].mig.gpu_instance_id]
        finally:
            await daemon.stop()

    kept = asyncio.run(first_run())
    asyncio.run(second_run(kept))
