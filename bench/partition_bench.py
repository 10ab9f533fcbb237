"""Partition create/delete latency through the real gRPC API of a daemon on the simulated node.

Starts `xpu-healthd --simulate <generated node>` as a child process (real unix sockets, real SQLite with fsync,
simulated MPS control and simulated MIG), then times CreatePartition and DeletePartition for TDM cards (10% of
compute, 1 GiB) and a MIG card (1g.18gb on card 6, so only nodes of 7 or more cards), one client at a time and
with concurrent clients on up to 4 TDM cards. Prints p50/p99 in milliseconds.

    python3 bench/partition_bench.py [--rounds 200] [--clients 8] [--gpus 8]
    python3 -m bench --only partition      # the same at every GPU count of the suite, as table rows
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(REPO))

from bench.common import BenchArgs, Row, median, percentile  # noqa: E402
from bench.scenarios import write_scenario  # noqa: E402
from healthd.api.v1 import partitions_pb2 as pb  # noqa: E402
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc  # noqa: E402

NAME = "partition"
MIG_CARD = 6  # MIG-enabled in every 8-card block of the generated nodes (bench/scenarios.py)
TDM_CARDS = 4  # the concurrent clients spread over this many TDM cards (fewer on smaller nodes)
START_TIMEOUT_SECONDS = 60.0


def report(name: str, samples: Sequence[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"{name:38} n={len(ms):5}  p50 {percentile(ms, 0.5):7.2f} ms  p99 {percentile(ms, 0.99):7.2f} ms  "
        f"mean {statistics.fmean(ms):7.2f} ms"
    )


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"daemon did not start (exit {proc.poll()})")
        time.sleep(0.05)


@contextmanager
def daemon(gpus: int, work_dir: Path | None = None) -> Iterator[str]:
    """A daemon on a generated ``gpus``-card node; yields the admin socket's gRPC target."""
    with tempfile.TemporaryDirectory(prefix="xpb-", dir=work_dir) as tmp:
        root = Path(tmp)
        scenario = write_scenario(root / "node.toml", gpus)
        # the daemon logs at warning: a MIG node logs its pre-existing ("foreign") instances, which is expected
        log = (root / "daemon.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "healthd",
                "--simulate",
                str(scenario),
                "--grpc-listen",
                f"unix:{root}/h.sock",
                "--state-dir",
                str(root / "state"),
                "--metrics-listen",
                "127.0.0.1:0",
                "--log-level",
                "warning",
            ],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            try:
                wait_for_socket(root / "healthd-admin.sock", proc)
            except RuntimeError as exc:
                log.flush()
                tail = "\n".join((root / "daemon.log").read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{exc}:\n{tail}") from None
            yield f"unix:{root}/healthd-admin.sock"
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()


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


@dataclass
class Samples:
    """Seconds per call, for one daemon."""

    gpus: int
    clients: int
    tdm_cards: int
    tdm_create: list[float] = field(default_factory=list)
    tdm_delete: list[float] = field(default_factory=list)
    mig_create: list[float] = field(default_factory=list)  # empty: no MIG card on this node
    mig_delete: list[float] = field(default_factory=list)
    concurrent_create: list[float] = field(default_factory=list)
    concurrent_delete: list[float] = field(default_factory=list)
    concurrent_seconds: float = 0.0


def measure(gpus: int, rounds: int, clients: int, work_dir: Path | None = None) -> Samples:
    tdm_cards = [str(i) for i in range(gpus) if i % 8 < MIG_CARD][:TDM_CARDS]
    out = Samples(gpus, clients, len(tdm_cards))
    with daemon(gpus, work_dir) as target:
        channel = grpc.insecure_channel(target)
        try:
            stub = pb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]
            for gpu in tdm_cards:
                stub.SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=pb.PARTITION_MODE_TDM), timeout=30)
            cycle(stub, "0", 10, "1GiB", 10)  # warm-up
            out.tdm_create, out.tdm_delete = cycle(stub, "0", 10, "1GiB", rounds)
            if gpus > MIG_CARD:
                mig = str(MIG_CARD)
                stub.SetCardMode(pb.SetCardModeRequest(gpu=mig, mode=pb.PARTITION_MODE_MIG), timeout=30)
                cycle(stub, mig, 10, "", 3)  # warm-up
                out.mig_create, out.mig_delete = cycle(stub, mig, 10, "", rounds)

            def client(i: int) -> tuple[list[float], list[float]]:
                with grpc.insecure_channel(target) as own:
                    stub = pb_grpc.PartitionsStub(own)  # type: ignore[no-untyped-call]
                    return cycle(stub, tdm_cards[i % len(tdm_cards)], 10, "1GiB", max(1, rounds // TDM_CARDS))

            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                results = list(pool.map(client, range(clients)))
            out.concurrent_seconds = time.perf_counter() - started
            out.concurrent_create = [t for c, _ in results for t in c]
            out.concurrent_delete = [t for _, d in results for t in d]
        finally:
            channel.close()
    return out


def rows(s: Samples) -> list[Row]:
    ms = 1e3
    g = s.gpus
    out = [
        Row("TDM create p50 (1 client)", "ms", median(s.tdm_create) * ms, g, note=f"{len(s.tdm_create)} rounds"),
        Row("TDM create p99 (1 client)", "ms", percentile(s.tdm_create, 0.99) * ms, g),
        Row("TDM delete p50 (1 client)", "ms", median(s.tdm_delete) * ms, g),
        Row("TDM delete p99 (1 client)", "ms", percentile(s.tdm_delete, 0.99) * ms, g),
    ]
    if s.mig_create:
        out += [
            Row("MIG create 1g.18gb p50 (1 client)", "ms", median(s.mig_create) * ms, g, note="needs >= 7 cards"),
            Row("MIG create 1g.18gb p99 (1 client)", "ms", percentile(s.mig_create, 0.99) * ms, g),
            Row("MIG delete p50 (1 client)", "ms", median(s.mig_delete) * ms, g),
            Row("MIG delete p99 (1 client)", "ms", percentile(s.mig_delete, 0.99) * ms, g),
        ]
    calls = len(s.concurrent_create) + len(s.concurrent_delete)
    clients = f"{s.clients} clients"
    out += [
        Row(f"TDM create p50 ({clients})", "ms", median(s.concurrent_create) * ms, g, note="on up to 4 TDM cards"),
        Row(f"TDM create p99 ({clients})", "ms", percentile(s.concurrent_create, 0.99) * ms, g),
        Row(f"TDM delete p50 ({clients})", "ms", median(s.concurrent_delete) * ms, g),
        Row(f"TDM delete p99 ({clients})", "ms", percentile(s.concurrent_delete, 0.99) * ms, g),
        Row(f"  throughput ({clients})", "/s", calls / s.concurrent_seconds if s.concurrent_seconds else 0.0, g),
    ]
    return out


def run(args: BenchArgs) -> list[Row]:
    rounds, clients = (40, 4) if args.quick else (200, 8)
    points: list[list[Row]] = [rows(measure(gpus, rounds, clients, args.work_dir)) for gpus in args.gpu_counts]
    # the table orders lines by first appearance: take the order of the fullest point (a 1-GPU node has no MIG)
    fullest: list[Row] = max(points, key=lambda point: len(point), default=[])
    order = {r.metric: i for i, r in enumerate(fullest)}
    return sorted((r for point in points for r in point), key=lambda r: order.get(r.metric, len(order)))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8, help="cards on the simulated node (MIG needs 7 or more)")
    opts = ap.parse_args(argv)
    s = measure(opts.gpus, opts.rounds, opts.clients)
    print(f"partitions on a simulated {s.gpus}-GPU node ({os.cpu_count()} CPUs)")
    report("TDM create (1 client)", s.tdm_create)
    report("TDM delete (1 client)", s.tdm_delete)
    if s.mig_create:
        report("MIG create 1g.18gb (1 client)", s.mig_create)
        report("MIG delete (1 client)", s.mig_delete)
    report(f"TDM create ({s.clients} clients, {s.tdm_cards} cards)", s.concurrent_create)
    report(f"TDM delete ({s.clients} clients, {s.tdm_cards} cards)", s.concurrent_delete)
    calls = len(s.concurrent_create) + len(s.concurrent_delete)
    print(f"{'throughput':38} {calls / s.concurrent_seconds:7.1f} calls/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
