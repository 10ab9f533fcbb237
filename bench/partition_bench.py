"""Partition create/delete latency through the real gRPC API of a daemon on the simulated node.

Starts `xpu-healthd --simulate` as a child process (real unix sockets, real SQLite with fsync, simulated MPS control
and simulated MIG), then times CreatePartition and DeletePartition for TDM and MIG cards, one client at a time and
with concurrent clients. Prints p50/p99 in milliseconds.

    python3 bench/partition_bench.py [--rounds 200] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from healthd.api.v1 import partitions_pb2 as pb  # noqa: E402
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(name: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"{name:38} n={len(ms):5}  p50 {percentile(ms, 0.5):7.2f} ms  p99 {percentile(ms, 0.99):7.2f} ms  "
        f"mean {statistics.fmean(ms):7.2f} ms"
    )


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"daemon did not start (exit {proc.poll()})")
        time.sleep(0.05)


def timed(fn: Any, request: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    reply = fn(request, timeout=30)
    return time.perf_counter() - start, reply


def cycle(stub: Any, gpu: str, compute: int, memory: str, rounds: int) -> tuple[list[float], list[float]]:
    creates, deletes = [], []
    owner = pb.Owner(lease=pb.LeaseOwner(holder="bench"))
    for _ in range(rounds):
        t, p = timed(
            stub.CreatePartition,
            pb.CreatePartitionRequest(owner=owner, gpu=gpu, compute_percent=compute, memory=memory),
        )
        creates.append(t)
        t, _ = timed(stub.DeletePartition, pb.DeletePartitionRequest(id=p.id))
        deletes.append(t)
    return creates, deletes


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rounds", type=int, default=200)
    args.add_argument("--clients", type=int, default=8)
    opts = args.parse_args()
    with tempfile.TemporaryDirectory(prefix="xpb-") as tmp:
        root = Path(tmp)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "healthd",
                "--simulate",
                "--grpc-listen",
                f"unix:{root}/h.sock",
                "--state-dir",
                str(root / "state"),
                "--metrics-listen",
                "127.0.0.1:0",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            wait_for_socket(root / "healthd-admin.sock", proc)
            channel = grpc.insecure_channel(f"unix:{root}/healthd-admin.sock")
            stub = pb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]
            for gpu in ("0", "1", "2", "3"):
                stub.SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=pb.PARTITION_MODE_TDM), timeout=30)
            stub.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=30)
            cycle(stub, "0", 10, "1GiB", 10)  # warm-up
            creates, deletes = cycle(stub, "0", 10, "1GiB", opts.rounds)
            report("TDM create (1 client)", creates)
            report("TDM delete (1 client)", deletes)
            creates, deletes = cycle(stub, "6", 10, "", opts.rounds)
            report("MIG create 1g.18gb (1 client)", creates)
            report("MIG delete (1 client)", deletes)

            def client(i: int) -> tuple[list[float], list[float]]:
                own = pb_grpc.PartitionsStub(grpc.insecure_channel(f"unix:{root}/healthd-admin.sock"))  # type: ignore[no-untyped-call]
                return cycle(own, str(i % 4), 10, "1GiB", opts.rounds // 4)

            started = time.perf_counter()
            with ThreadPoolExecutor(opts.clients) as pool:
                results = list(pool.map(client, range(opts.clients)))
            elapsed = time.perf_counter() - started
            creates = [t for c, _ in results for t in c]
            deletes = [t for _, d in results for t in d]
            report(f"TDM create ({opts.clients} clients, 4 cards)", creates)
            report(f"TDM delete ({opts.clients} clients, 4 cards)", deletes)
            print(f"{'throughput':38} {(len(creates) + len(deletes)) / elapsed:7.1f} calls/s")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
