"""`xpuctl partitions exec` keeps a lease-owned partition while its command runs: a command that runs past the
lease still has its partition (and its MPS pipe) at the end, and xpuctl exits with the command's status. Real
daemon on the simulated node (reconciler every 0.3 s), xpuctl as its own process."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from exporter.sampler import SamplerSettings
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config
from healthd.daemon.daemon import Daemon
from healthd.partition.settings import PartitionSettings
from tests.support.paths import REPO

# the command says it runs, waits for the test's word (given once the lease it was created with has run out), then
# checks that its MPS pipe directory is still there
JOB = """import os, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
(here / "started").touch()
while not (here / "go").exists():
    time.sleep(0.05)
sys.exit(0 if os.path.isdir(os.environ["CUDA_MPS_PIPE_DIRECTORY"]) else 9)
"""
TTL = 5.0
PAST = 3.0  # how far past the lease the command runs: ten reconcile passes that would reclaim it


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


def test_exec_keeps_its_partition_past_the_lease(tmp_path: Path, simulated_config: Callable[[Config], Config]) -> None:
    config = simulated_config(
        Config(
            sampler=SamplerSettings(interval_seconds=0.5),
            partitions=PartitionSettings(reconcile_interval_seconds=0.3),
        )
    )

    async def go() -> None:
        daemon = Daemon(config, allow_fallback=True)
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="2", mode=pb.PARTITION_MODE_TDM), timeout=10)
                owner = pb.Owner(lease=pb.LeaseOwner(holder="job", ttl_seconds=TTL))
                made = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=owner, gpu="2", compute_percent=30), timeout=10
                )
                run = asyncio.create_task(
                    xpuctl(tmp_path / "h.sock", "exec", made.id, "--", sys.executable, "-c", JOB, str(tmp_path))
                )
                # the test holds the lease until the command runs: xpuctl's own start-up (seconds on a busy machine)
                # is not what is tested, its renewals while the command runs are
                held = made.lease_expires_at
                while not (tmp_path / "started").exists():
                    assert not run.done(), run.result()
                    renewed = await stub.RenewLease(pb.RenewLeaseRequest(id=made.id, ttl_seconds=TTL), timeout=10)
                    held = renewed.lease_expires_at
                    await asyncio.sleep(0.5)
                await asyncio.sleep(max(0.0, held + PAST - time.time()))  # the lease the test gave has run out
                kept = await stub.GetPartition(pb.GetPartitionRequest(id=made.id), timeout=10)
                assert kept.state == "ready" and kept.lease_expires_at > held + PAST, "xpuctl renewed the lease"
                (tmp_path / "go").touch()
                code, out = await run
                assert code == 0, out
                listed = await stub.ListPartitions(pb.ListPartitionsRequest(), timeout=10)
                assert [p.id for p in listed.partitions] == [made.id]
                # once the command ended nothing renews the lease: a long one for the next xpuctl to start in
                await stub.RenewLease(pb.RenewLeaseRequest(id=made.id, ttl_seconds=600), timeout=10)
                code, out = await xpuctl(tmp_path / "h.sock", "exec", made.id, "--", "sh", "-c", "exit 7")
                assert code == 7, out
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=10)
                long = pb.Owner(lease=pb.LeaseOwner(holder="long", ttl_seconds=3000))
                asked = time.time()
                mig = await stub.CreatePartition(
                    pb.CreatePartitionRequest(owner=long, gpu="6", compute_percent=10), timeout=10
                )
                code, out = await xpuctl(tmp_path / "h.sock", "list", "--gpu", "6")
                assert code == 0, out
                since = time.time() - asked
                (row,) = [line.split() for line in out.splitlines() if line.startswith(mig.id)]
                assert mig.mig.profile == "1g.18gb" and "1g.18gb" in row  # the profile picked, beside what was asked
                left = re.fullmatch(r"\((\d+)m(\d\d)s\)", row[row.index("long") + 2])  # the lease's time left
                assert left is not None, row
                assert 3000 - since - 1 <= int(left[1]) * 60 + int(left[2]) <= 3000, row
        finally:
            (tmp_path / "go").touch()  # a test that failed midway leaves no command waiting for its word
            await daemon.stop()

    asyncio.run(go())
