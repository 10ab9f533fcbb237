"""Fault latency: injected XID -> WatchFaults subscriber, and injected XID -> replacement hook command.

Everything but the XID source is real: the fault engine over its SQLite journal (WAL, synchronous=FULL), the
daemon's gRPC server on a unix socket with a real WatchFaults subscriber (grpc channel in another thread), and
the reference hook server (`xpuctl hook serve`, a separate process) whose --exec command records when it ran.
With ``--source xid`` (the default) each XID is injected into a simulated node (``bench.scenarios.scaled``) and
travels the daemon's whole path: the driver-event thread of the XID watcher, the XID catalog, the engine, the
journal, then the subscriber and the hook. ``--source engine`` starts at the engine's ``event()`` entry instead,
which isolates the journal and delivery cost.

Each injection uses a (GPU, XID) pair not used before, so there are at most 26 (the catalog's XIDs that ask for
an action) per GPU: a 1-GPU node gets 26 samples, whatever the count asked for.

    python3 bench/fault_latency_bench.py [--count 200] [--gpus 8] [--source xid|engine]
    python3 -m bench --only fault_latency      # the same at every GPU count of the suite, as table rows
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(ROOT))

from bench.common import BenchArgs, Row, median, percentile  # noqa: E402
from bench.scenarios import scaled  # noqa: E402
from exporter.backends.simulated import SimulatedBackend  # noqa: E402
from exporter.sampler import Sampler, SamplerSettings  # noqa: E402
from healthd.api.v1 import health_pb2 as pb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as pb_grpc  # noqa: E402
from healthd.daemon.health import HealthComponent  # noqa: E402
from healthd.faults import service as health_service  # noqa: E402
from healthd.faults.journal import Journal  # noqa: E402
from healthd.faults.settings import FaultsSettings, HookSettings  # noqa: E402
from healthd.findings import Action, Finding, FindingKind, GpuRef, Severity  # noqa: E402
from healthd.logs import configure_logging  # noqa: E402
from healthd.rpc.server import GrpcServer, Service  # noqa: E402
from healthd.xid.catalog import XidCatalog, load_catalog  # noqa: E402
from healthd.xid.watcher import XidSettings, build_watcher  # noqa: E402

NAME = "fault_latency"
TIMEOUT_SECONDS = 30.0  # for one fault to reach the subscriber, and (doubled) the hook


def summary(name: str, seconds: Sequence[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{name:40} n={len(ms):4}  p50={percentile(ms, 0.5):8.2f} ms  p99={percentile(ms, 0.99):8.2f} ms"
        f"  max={max(ms):8.2f} ms  mean={statistics.fmean(ms):8.2f} ms"
    )


def bench_finding(i: int) -> Finding:
    gpu = GpuRef(i % 8, f"GPU-bench-{i % 8}", f"00000000:{i % 8:02x}:00.0")
    return Finding("xid", f"xid_{1000 + i}", Severity.FATAL, Action.REPLACE_NODE, "bench XID", gpu,
                   evidence={"xid": str(1000 + i)}, kind=FindingKind.EVENT)  # fmt: skip


class engine_injector:  # noqa: N801 - used like a function
    """Hands a distinct fatal XID finding straight to the engine."""

    def __init__(self, health: HealthComponent) -> None:
        self._health = health

    def __call__(self, i: int) -> None:
        self._health.engine.accept_event(bench_finding(i))

    def close(self) -> None:
        pass


class xid_injector:  # noqa: N801 - used like a function
    """Injects XIDs into a simulated node watched by the daemon's XID watcher (driver-event thread + catalog).

    Each injection uses a (GPU, XID) pair not used before, so neither the watcher's merge window nor the engine's
    dedup swallows it: every one must become a new fault.
    """

    def __init__(self, health: HealthComponent, gpus: int = 8) -> None:
        self._sim = SimulatedBackend(scaled(gpus))
        self._sim.open()
        self._sampler = Sampler(self._sim, SamplerSettings(interval_seconds=60, call_deadline_seconds=5))
        self._sampler.run_once()  # the watcher maps driver events to cards through the inventory
        catalog = load_catalog()
        self._codes = action_xids(catalog)
        self._watcher = build_watcher(XidSettings(), self._sim, health.engine, self._sampler.latest, kmsg_path=None)
        self._watcher.start()

    @property
    def capacity(self) -> int:
        """How many injections stay distinct (GPU, XID) pairs."""
        return self._sim.device_count() * len(self._codes)

    def __call__(self, i: int) -> None:
        gpus = self._sim.device_count()
        code = self._codes[(i // gpus) % len(self._codes)]
        self._sim.inject("xid", i % gpus, {"code": str(code)})

    def close(self) -> None:
        self._watcher.stop()
        self._sampler.stop()
        self._sim.close()


def action_xids(catalog: XidCatalog | None = None) -> list[int]:
    """The catalog's known XIDs that ask for an action (restart_app or more): each one becomes a new fault."""
    cat = catalog if catalog is not None else load_catalog()
    return [x for x in range(1, 200) if cat.lookup(x).known and cat.lookup(x).action >= 1]


@dataclass
class Samples:
    """Seconds per injection, for one run of ``measure``."""

    gpus: int
    source: str
    commit: list[float] = field(default_factory=list)  # the inject call (xid) or engine.accept_event (engine)
    to_subscriber: list[float] = field(default_factory=list)
    to_hook: list[float] = field(default_factory=list)
    repeat: list[float] = field(default_factory=list)  # the same active XID again: dedup, count written


def measure(count: int, source: str = "xid", gpus: int = 8) -> Samples:
    """Inject ``count`` XIDs one at a time (fewer on small nodes, see the module doc) and time where they land."""
    tmp = Path(tempfile.mkdtemp(prefix="xpu-fault-bench-"))
    hook_sock, daemon_sock, ran = tmp / "hook.sock", tmp / "healthd.sock", tmp / "ran.txt"
    hook_proc = subprocess.Popen(
        [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", f"unix:{hook_sock}",
         "--exec", f'echo "$XPU_FAULT_ID $(date +%s%N)" >> {ran}', "--state", str(tmp / "hook.sqlite"),
         "--dedup-window", "0", "--log-level", "error"],  # every XID a run: the bench times each one
        env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    min_action = "replace_node" if source == "engine" else "restart_app"
    hook = HookSettings(endpoints=(f"unix:{hook_sock}",), min_action=min_action, node_name="bench",
                        backoff_initial_seconds=0.05, backoff_max_seconds=0.2)  # fmt: skip
    health = HealthComponent(Journal(tmp / "state" / "faults.sqlite"), FaultsSettings(), hook, boot_id="bench")
    server = GrpcServer(
        [f"unix:{daemon_sock}"], [Service(health_service.SERVICE_NAME, health.service, health_service.add_to_server)]
    )
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    inject: engine_injector | xid_injector | None = None
    started = False
    out = Samples(gpus if source == "xid" else 8, source)
    try:

        async def start() -> None:
            await health.start()
            await server.start()

        asyncio.run_coroutine_threadsafe(start(), loop).result(TIMEOUT_SECONDS)
        started = True
        if source == "engine":
            inject = engine_injector(health)
        else:
            inject = xid_injector(health, gpus)
            count = min(count, inject.capacity)

        received: queue.Queue[tuple[str, int]] = queue.Queue()

        def subscribe() -> None:
            with grpc.insecure_channel(f"unix:{daemon_sock}") as channel:
                stub = pb_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
                stream = stub.WatchFaults(pb.WatchFaultsRequest(after_seq=0))
                try:
                    for item in stream:
                        received.put((item.record.fault.id, time.time_ns()))
                except grpc.RpcError:
                    return  # the server is stopping

        threading.Thread(target=subscribe, daemon=True).start()
        with grpc.insecure_channel(f"unix:{hook_sock}") as probe:
            grpc.channel_ready_future(probe).result(timeout=TIMEOUT_SECONDS)  # the hook is up: no backoff in it
        time.sleep(0.2)  # the subscriber's stream is open

        for i in range(count):
            t0 = time.time_ns()
            c0 = time.perf_counter()
            inject(i)
            out.commit.append(time.perf_counter() - c0)
            try:
                fault_id, t_sub = received.get(timeout=TIMEOUT_SECONDS)
            except queue.Empty:
                raise RuntimeError(f"XID {i} never reached the WatchFaults subscriber") from None
            out.to_subscriber.append((t_sub - t0) / 1e9)
            deadline = time.monotonic() + 2 * TIMEOUT_SECONDS
            while True:
                lines = ran.read_text().splitlines() if ran.exists() else []
                if len(lines) > i:
                    ran_id, t_hook = lines[i].split()
                    if ran_id != fault_id:
                        raise RuntimeError(f"hook ran for {ran_id}, the subscriber saw {fault_id}")
                    out.to_hook.append((int(t_hook) - t0) / 1e9)
                    break
                if hook_proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the hook never ran the command for XID {i} (hook exit {hook_proc.poll()})")
                time.sleep(0.0005)

        # a flood: the same XID again and again at the engine (dedup: count and last_seen are written, no new record)
        finding = bench_finding(0)
        health.engine.accept_event(finding)
        for _ in range(count):
            c0 = time.perf_counter()
            health.engine.accept_event(finding)
            out.repeat.append(time.perf_counter() - c0)
        return out
    finally:
        if inject is not None:
            inject.close()
        if started:
            asyncio.run_coroutine_threadsafe(server.stop(0.5), loop).result(TIMEOUT_SECONDS)
            asyncio.run_coroutine_threadsafe(health.stop(flush_seconds=5.0), loop).result(TIMEOUT_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        if not loop_thread.is_alive():
            loop.close()
        hook_proc.terminate()
        try:
            hook_proc.wait(10)
        except subprocess.TimeoutExpired:
            hook_proc.kill()
            hook_proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


def rows(s: Samples, note: str = "") -> list[Row]:
    ms = 1e3
    note = note or f"{len(s.to_subscriber)} XIDs, one at a time"
    return [
        Row("XID -> WatchFaults subscriber p50", "ms", median(s.to_subscriber) * ms, s.gpus, note=note),
        Row("XID -> WatchFaults subscriber p99", "ms", percentile(s.to_subscriber, 0.99) * ms, s.gpus),
        Row("XID -> hook command running p50", "ms", median(s.to_hook) * ms, s.gpus, note="hook spawns sh+date"),
        Row("XID -> hook command running p99", "ms", percentile(s.to_hook, 0.99) * ms, s.gpus),
        Row("  inject call p50", "ms", median(s.commit) * ms, s.gpus),
        Row("  repeat of an active XID p50 (dedup, durable)", "ms", median(s.repeat) * ms, s.gpus),
        Row("  repeat of an active XID p99", "ms", percentile(s.repeat, 0.99) * ms, s.gpus),
    ]


def run(args: BenchArgs) -> list[Row]:
    count = 40 if args.quick else 200
    note = f"{count} XIDs one at a time ({len(action_xids())} on 1 GPU)"
    out: list[Row] = []
    for gpus in args.gpu_counts:
        out += rows(measure(count, "xid", gpus), note)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="XIDs to inject (one at a time)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs on the simulated node (--source xid)")
    parser.add_argument("--source", choices=["xid", "engine"], default="xid", help="where each XID enters")
    args = parser.parse_args(argv)

    configure_logging("warning")
    s = measure(args.count, args.source, args.gpus)
    where = (
        "the engine's event() entry"
        if args.source == "engine"
        else f"a simulated {s.gpus}-GPU node's driver (full XID path)"
    )
    print(f"fault latency, {len(s.to_subscriber)} XIDs injected one at a time at {where} ({os.cpu_count()} CPUs)")
    print(summary("inject call" if args.source == "xid" else "engine.accept_event() (journal commit)", s.commit))
    print(summary("XID -> WatchFaults subscriber", s.to_subscriber))
    print(summary("XID -> hook command running", s.to_hook))
    print(summary("repeat of an active XID (dedup, durable)", s.repeat))
    print("(hook latency includes the reference hook spawning /bin/sh and date for every fault)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
