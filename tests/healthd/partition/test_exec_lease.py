"""`xpuctl partitions exec` keeps a lease-owned partition while its command runs: a command that runs past the
lease still has its partition (and its MPS pipe) at the end, and xpuctl exits with the command's status. Real
daemon on the simulated node (reconciler every 0.3 s), xpuctl as its own process."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import grpc

from exporter.sampler import SamplerSettings
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config, with_overrides
from healthd.daemon.daemon import Daemon
from healthd.partition.settings import PartitionSettings
from tests.support.paths import REPO

# the command outlives the 5 s lease by far, then checks that its MPS pipe directory is still there
JOB = "import os, sys, time; time.sleep(9); sys.exit(0 if os.path.isdir(os.environ['CUDA_MPS_PIPE_DIRECTORY']) else 9)"


async def xpuctl(socket: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "healthd.cli",
        "--socket",
        f"unix:{socket}",
        "partitions",
        *args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def test_exec_keeps_its_partition_past_the_lease(tmp_path: Path) -> None:
    config = with_overrides(
        Config(
            sampler=SamplerSettings(interval_seconds=0.5),
            partitions=PartitionSettings(reconcile_interval_seconds=0.3),
        ),
        simulate="h200x8",
        metrics_listen="127.0.0.1:0",
        grpc_listen=(f"unix:{tmp_path}/h.sock",),
        state_dir=tmp_path / "state",
    )

    async def go() -> None:
        daemon = Daemon(config, allow_fallback=True)
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="2", mode=pb.PARTITION_MODE_TDM), timeout=10)
                owner = pb.Owner(lease=pb.LeaseOwner(holder="job", ttl_seconds=5))
                made = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=owner, gpu="2", compute_percent=30), timeout=10
                )
                code, out = await xpuctl(tmp_path / "h.sock", "exec", made.id, "--", sys.executable, "-c", JOB)
                assert code == 0, out
                listed = await stub.ListPartitions(pb.ListPartitionsRequest(), timeout=10)
                assert [p.id for p in listed.partitions] == [made.id]
                code, out = await xpuctl(tmp_path / "h.sock", "exec", made.id, "--", "sh", "-c", "exit 7")
                assert code == 7, out
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=10)
                long = pb.Owner(lease=pb.LeaseOwner(holder="long", ttl_seconds=3000))
                mig = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=long, gpu="6", compute_percent=10), timeout=10
                )
                code, out = await xpuctl(tmp_path / "h.sock", "list", "--gpu", "6")
                assert code == 0, out
                (row,) = [line.split() for line in out.splitlines() if line.startswith(mig.id)]
                assert mig.mig.profile == "1g.18gb" and "1g.18gb" in row  # the profile picked, beside what was asked
                assert row[row.index("long") + 2] in ("(49m59s)", "(49m58s)", "(49m57s)"), row  # the lease's expiry
        finally:
            await daemon.stop()

    asyncio.run(go())
