"""The daemon brings the partition service up: admin socket 0600, reads on the main socket, metrics, clean stop."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config
from healthd.daemon.daemon import Daemon


def test_daemon_serves_partitions(tmp_path: Path, simulated_config: Callable[[Config], Config]) -> None:
    config = simulated_config(Config())

    async def go() -> None:
        daemon = Daemon(config, allow_fallback=True)
        await daemon.start()
        try:
            admin = tmp_path / "healthd-admin.sock"
            assert admin.stat().st_mode & 0o777 == 0o600
            async with grpc.aio.insecure_channel(f"unix:{admin}") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="3", mode=pb.PARTITION_MODE_TDM))
                p = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=pb.Owner(lease=pb.LeaseOwner(holder="t")), gpu="3", memory="1GiB")
                )
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/h.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                listed = await stub.ListPartitions(pb.ListPartitionsRequest())
                assert [q.id for q in listed.partitions] == [p.id]
            port = daemon.metrics.http.port

            def scrape() -> str:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

            # /metrics is rendered when a Snapshot is published: the partition shows from the next sample on
            give_up = time.monotonic() + 30
            while f'partition_id="{p.id}"' not in (text := await asyncio.to_thread(scrape)):
                assert time.monotonic() < give_up, "the partition never reached /metrics"
                await asyncio.sleep(0.2)
            assert 'xpu_gpu_partition_mode{gpu="3",mode="tdm"' in text
            assert (tmp_path / "state" / "cdi" / "xpu-runtime-kit.io-gpu.json").exists()  # simulated: not /var/run/cdi
            assert (tmp_path / "mps" / p.id / "pipe").is_dir()
        finally:
            await daemon.stop()
        assert not admin.exists()

    asyncio.run(go())
