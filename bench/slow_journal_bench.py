"""Slow journal: a 200 ms delay on every fault-journal commit, against the sampling cycle and GetNodeHealth.

A writer thread keeps the journal busy (a new event fault every 50 ms, so a commit is nearly always in flight),
the probes run on every Snapshot, and meanwhile we time ``Sampler.run_once`` and GetNodeHealth over the daemon's
real gRPC server on a unix socket. Run once with no delay and once with the delay; the difference is what a slow
disk costs the hot paths (the goal: under 50 ms).

    python3 bench/slow_journal_bench.py [--delay 0.2] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(ROOT))

from bench.common import percentile  # noqa: E402
from exporter.backends.simulated import SimulatedBackend  # noqa: E402
from exporter.sampler import Sampler, SamplerSettings  # noqa: E402
from healthd.api.v1 import health_pb2 as pb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as pb_grpc  # noqa: E402
from healthd.daemon.health import HealthComponent  # noqa: E402
from healthd.faults import service as health_service  # noqa: E402
from healthd.faults.fault import FaultRecord  # noqa: E402
from healthd.faults.journal import Change, Journal  # noqa: E402
from healthd.faults.settings import FaultsSettings, HookSettings  # noqa: E402
from healthd.findings import Action, Finding, FindingKind, GpuRef, Severity  # noqa: E402
from healthd.logs import configure_logging  # noqa: E402
from healthd.probes import HealthSettings, ProbeHost, default_probes  # noqa: E402
from healthd.probes.runner import ProbeRunner  # noqa: E402
from healthd.rpc.server import GrpcServer, Service  # noqa: E402


class DelayedJournal(Journal):
    def __init__(self, path: Path, delay: float) -> None:
        super().__init__(path)
        self.delay = delay

    def commit(self, changes: Sequence[Change], at: float, **kwargs: Any) -> list[FaultRecord]:
        time.sleep(self.delay)  # as if fsync took this long
        return super().commit(changes, at, **kwargs)


def measure(delay: float, seconds: float) -> tuple[list[float], list[float], int]:
    with tempfile.TemporaryDirectory(prefix="slow-journal-") as tmp:
        root = Path(tmp)
        runtime = HealthComponent(DelayedJournal(root / "faults.sqlite", delay), FaultsSettings(), HookSettings())
        server = GrpcServer(
            [f"unix:{root}/h.sock"],
            [Service(health_service.SERVICE_NAME, runtime.service, health_service.add_to_server)],
        )
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        async def start() -> None:
            await runtime.start()
            await server.start()

        asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        backend = SimulatedBackend.from_name("h200x8")
        sampler = Sampler(backend, SamplerSettings(interval_seconds=60, call_deadline_seconds=5))
        runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=root)), runtime.engine)
        sampler.subscribe(runner.on_snapshot, "probes")
        stop = threading.Event()
        written = [0]

        def writer() -> None:
            gpu = GpuRef(0, backend.scenario.cards[0].uuid, "")
            while not stop.is_set():
                written[0] += 1
                runtime.engine.event(
                    Finding(
                        "bench",
                        f"event_{written[0]}",
                        Severity.WARNING,
                        Action.NONE,
                        "bench",
                        gpu,
                        kind=FindingKind.EVENT,
                    )
                )
                stop.wait(0.05)

        threading.Thread(target=writer, daemon=True).start()
        cycles: list[float] = []
        health: list[float] = []
        with grpc.insecure_channel(f"unix:{root}/h.sock") as channel:
            stub = pb_grpc.HealthStub(channel)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                sampler.run_once()
                cycles.append(time.perf_counter() - started)
                for _ in range(5):
                    started = time.perf_counter()
                    stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=30)
                    health.append(time.perf_counter() - started)
                time.sleep(0.05)
        stop.set()
        sampler.stop()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        asyncio.run_coroutine_threadsafe(runtime.stop(flush_seconds=5.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        return cycles, health, written[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.2, help="seconds added to every commit (default 0.2)")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long each run measures (default 15)")
    args = parser.parse_args(argv)
    configure_logging("error")
    rows = []
    for delay in (0.0, args.delay):
        cycles, health, written = measure(delay, args.seconds)
        rows.append((delay, cycles, health, written))
    print(f"{'commit delay':>12} {'cycles':>7} {'cycle p50 ms':>13} {'cycle p99 ms':>13} "
          f"{'health p50 ms':>14} {'health p99 ms':>14} {'faults written':>15}")  # fmt: skip
    for delay, cycles, health, written in rows:
        print(
            f"{delay * 1000:10.0f}ms {len(cycles):7d} {1000 * statistics.median(cycles):13.1f} "
            f"{1000 * percentile(cycles, 0.99):13.1f} {1000 * statistics.median(health):14.1f} "
            f"{1000 * percentile(health, 0.99):14.1f} {written:15d}"
        )
    base, slow = rows
    cycle_p99 = percentile(slow[1], 0.99) - percentile(base[1], 0.99)
    health_p99 = percentile(slow[2], 0.99) - percentile(base[2], 0.99)
    print(
        f"slowdown from the delay: cycle p99 {1000 * cycle_p99:+.1f} ms, GetNodeHealth p99 {1000 * health_p99:+.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
