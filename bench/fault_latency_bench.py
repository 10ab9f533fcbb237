"""Fault latency: injected XID -> WatchFaults subscriber, and injected XID -> replacement hook command.

Everything but the XID source is real: the fault engine over its SQLite journal (WAL, synchronous=FULL), the
daemon's gRPC server on a unix socket with a real WatchFaults subscriber (grpc channel in another thread), and
the reference hook server (`xpuctl hook serve`, a separate process) whose --exec command records when it ran.
With ``--source xid`` (the default) each XID is injected into the simulated backend and travels the daemon's
whole path: the driver-event thread of the XID watcher, the XID catalog, the engine, the journal, then the
subscriber and the hook. ``--source engine`` starts at the engine's ``event()`` entry instead, which isolates the
journal and delivery cost.

    python3 bench/fault_latency_bench.py [--count 200] [--source xid|engine]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.backends.simulated import SimulatedBackend  # noqa: E402
from exporter.sampler import Sampler, SamplerConfig  # noqa: E402
from healthd.api.v1 import health_pb2 as pb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as pb_grpc  # noqa: E402
from healthd.config import FaultsSettings, HookSettings  # noqa: E402
from healthd.faults import service as health_service  # noqa: E402
from healthd.faults.journal import Journal  # noqa: E402
from healthd.faults.model import Action, Finding, GpuRef, Severity  # noqa: E402
from healthd.faults.runtime import FaultRuntime  # noqa: E402
from healthd.faults.xid_catalog import load_catalog  # noqa: E402
from healthd.logs import configure_logging  # noqa: E402
from healthd.probes import xid_watcher  # noqa: E402
from healthd.probes.config import ProbeSettings  # noqa: E402
from healthd.server import GrpcServer, Service  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(name: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{name:40} n={len(ms):4}  p50={percentile(ms, 50):8.2f} ms  p99={percentile(ms, 99):8.2f} ms"
        f"  max={max(ms):8.2f} ms  mean={statistics.fmean(ms):8.2f} ms"
    )


def bench_finding(i: int) -> Finding:
    gpu = GpuRef(i % 8, f"GPU-bench-{i % 8}", f"00000000:{i % 8:02x}:00.0")
    return Finding("xid", f"xid_{1000 + i}", Severity.FATAL, Action.REPLACE_NODE, "bench XID", gpu,
                   evidence={"xid": str(1000 + i)}, kind="event")  # fmt: skip


class engine_injector:  # noqa: N801 - used like a function
    """Hands a distinct fatal XID finding straight to the engine."""

    def __init__(self, runtime: FaultRuntime) -> None:
        self._runtime = runtime

    def __call__(self, i: int) -> None:
        self._runtime.engine.accept_event(bench_finding(i))

    def close(self) -> None:
        pass


class xid_injector:  # noqa: N801 - used like a function
    """Injects XIDs into a simulated node watched by the daemon's XID watcher (driver-event thread + catalog).

    Each injection uses a (GPU, XID) pair not used before, so neither the watcher's merge window nor the engine's
    dedup swallows it: every one must become a new fault.
    """

    def __init__(self, runtime: FaultRuntime) -> None:
        self._sim = SimulatedBackend.from_name("h200x8")
        self._sim.open()
        self._sampler = Sampler(self._sim, SamplerConfig(interval_seconds=60, call_deadline_seconds=5))
        self._sampler.run_once()  # the watcher maps driver events to cards through the inventory
        catalog = load_catalog()
        self._codes = [x for x in range(1, 200) if catalog.lookup(x).known and catalog.lookup(x).action >= 1]
        self._watcher = xid_watcher(ProbeSettings(), self._sim, runtime.engine, self._sampler.latest, simulated=True)
        self._watcher.start()

    def __call__(self, i: int) -> None:
        gpus = self._sim.device_count()
        code = self._codes[(i // gpus) % len(self._codes)]
        self._sim.inject("xid", i % gpus, {"code": str(code)})

    def close(self) -> None:
        self._watcher.stop()
        self._sampler.stop()
        self._sim.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="XIDs to inject (one at a time)")
    parser.add_argument("--source", choices=["xid", "engine"], default="xid", help="where each XID enters")
    args = parser.parse_args()

    configure_logging("warning")
    tmp = Path(tempfile.mkdtemp(prefix="xpu-fault-bench-"))
    hook_sock, daemon_sock, ran = tmp / "hook.sock", tmp / "healthd.sock", tmp / "ran.txt"
    hook_proc = subprocess.Popen(
        [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", f"unix:{hook_sock}",
         "--exec", f'echo "$XPU_FAULT_ID $(date +%s%N)" >> {ran}', "--state", str(tmp / "hook.sqlite"),
         "--log-level", "error"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    min_action = "replace_node" if args.source == "engine" else "restart_app"
    hook = HookSettings(endpoints=(f"unix:{hook_sock}",), min_action=min_action, node_name="bench",
                        backoff_initial_seconds=0.05, backoff_max_seconds=0.2)  # fmt: skip
    runtime = FaultRuntime(Journal(tmp / "state" / "faults.sqlite"), FaultsSettings(), hook, boot_id="bench")
    server = GrpcServer(
        [f"unix:{daemon_sock}"], [Service(health_service.SERVICE_NAME, runtime.service, health_service.add_to_server)]
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start() -> None:
        await runtime.start()
        await server.start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    inject = engine_injector(runtime) if args.source == "engine" else xid_injector(runtime)

    received: queue.Queue[tuple[str, int]] = queue.Queue()

    def subscribe() -> None:
        with grpc.insecure_channel(f"unix:{daemon_sock}") as channel:
            stream = pb_grpc.HealthStub(channel).WatchFaults(pb.WatchFaultsRequest(after_seq=0))
            try:
                for item in stream:
                    received.put((item.record.fault.id, time.time_ns()))
            except grpc.RpcError:
                return  # the server is stopping

    threading.Thread(target=subscribe, daemon=True).start()
    with grpc.insecure_channel(f"unix:{hook_sock}") as probe:
        grpc.channel_ready_future(probe).result(timeout=30)  # the hook is up: no backoff in the numbers
    time.sleep(0.2)  # the subscriber's stream is open

    to_subscriber: list[float] = []
    to_hook: list[float] = []
    commit: list[float] = []
    for i in range(args.count):
        t0 = time.time_ns()
        c0 = time.perf_counter()
        inject(i)
        commit.append(time.perf_counter() - c0)
        fault_id, t_sub = received.get(timeout=30)
        to_subscriber.append((t_sub - t0) / 1e9)
        deadline = time.monotonic() + 60
        while True:
            lines = ran.read_text().splitlines() if ran.exists() else []
            if len(lines) > i:
                ran_id, t_hook = lines[i].split()
                assert ran_id == fault_id, (ran_id, fault_id)
                to_hook.append((int(t_hook) - t0) / 1e9)
                break
            if time.monotonic() > deadline:
                raise SystemExit("hook never ran the command")
            time.sleep(0.0005)

    # a flood: the same XID again and again at the engine (dedup: count and last_seen are written, no new record)
    finding = bench_finding(0)
    runtime.engine.accept_event(finding)
    repeat: list[float] = []
    for _ in range(args.count):
        c0 = time.perf_counter()
        runtime.engine.accept_event(finding)
        repeat.append(time.perf_counter() - c0)
    inject.close()

    asyncio.run_coroutine_threadsafe(server.stop(0.5), loop).result(30)
    asyncio.run_coroutine_threadsafe(runtime.stop(), loop).result(30)
    hook_proc.terminate()
    hook_proc.wait(10)
    shutil.rmtree(tmp, ignore_errors=True)
    where = "the engine's event() entry" if args.source == "engine" else "the simulated driver (full XID path)"
    print(f"fault latency, {args.count} XIDs injected one at a time at {where} ({os.cpu_count()} CPUs)")
    print(summary("inject call" if args.source == "xid" else "engine.accept_event() (journal commit)", commit))
    print(summary("XID -> WatchFaults subscriber", to_subscriber))
    print(summary("XID -> hook command running", to_hook))
    print(summary("repeat of an active XID (dedup, durable)", repeat))
    print("(hook latency includes the reference hook spawning /bin/sh and date for every fault)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
