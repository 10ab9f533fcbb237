"""Hung cards: does a node with stuck driver calls keep serving everything else?

The scenario (a real daemon process on the simulated h200x8 node, real gRPC clients on its unix sockets, a real
replacement hook server in this process):

1. GPUs 6 and 7 are put in MIG mode, GPUs 2 and 3 in TDM mode, with one TDM partition on GPU 3.
2. GPUs 6 and 7 hang in ``mig_instances``; GPU 3 hangs in every driver call. The hangs stay for ``--hold`` seconds.
3. Meanwhile a client loop calls ListFaults, GetNodeHealth, Topology.PreferredAllocation, GetCapacity of GPU 2,
   CreatePartition and DeletePartition on GPU 2, and grpc.health.v1 Check, each with a 30 s deadline, and a
   WatchFaults stream stays open.
4. Half-way, XID 79 is injected on healthy GPU 1: how long until the hook and the WatchFaults stream have it?
5. At the end: the daemon's thread count against the count before the hangs, what /healthz and grpc.health.v1 say,
   and how long SIGTERM takes (the hangs still in place) and with what exit code.

    python3 bench/hung_cards_bench.py [--hold 120]

It prints one table. tests/healthd/daemon/test_hung_cards.py runs the same scenario and asserts the behaviour
(not the times).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, percentile, proc_status_kib  # noqa: E402
from healthd.api.v1 import health_pb2 as hpb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as hpb_grpc  # noqa: E402
from healthd.api.v1 import hook_pb2, hook_pb2_grpc  # noqa: E402
from healthd.api.v1 import partitions_pb2 as ppb  # noqa: E402
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc  # noqa: E402
from healthd.api.v1 import simulation_pb2 as spb  # noqa: E402
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc  # noqa: E402
from healthd.api.v1 import topology_pb2 as tpb  # noqa: E402
from healthd.api.v1 import topology_pb2_grpc as tpb_grpc  # noqa: E402

CALL_DEADLINE = 30.0
MIG_CARDS = (6, 7)
TDM_HUNG_CARD = 3
HEALTHY_TDM_CARD = 2
XID_CARD = 1


class RecordingHook(hook_pb2_grpc.ReplacementHookServicer):
    """A replacement hook that notes when each fault arrived."""

    def __init__(self) -> None:
        self.arrivals: dict[str, tuple[float, Any]] = {}
        self.arrived = threading.Condition()

    def ReportFault(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.arrived:
            self.arrivals.setdefault(request.fault_id, (time.monotonic(), request))
            self.arrived.notify_all()
        return hook_pb2.ReportFaultAck(outcome="recorded")

    def wait_for(self, match: Callable[[Any], bool], timeout: float) -> float | None:
        """Monotonic arrival time of the first report that matches, or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                for at, report in self.arrivals.values():
                    if match(report):
                        return at
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.arrived.wait(left)


@dataclass
class CallStats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def note(self, name: str, seconds: float, error: str | None) -> None:
        self.latencies[name].append(seconds)
        if error is not None:
            self.failures[name][error] += 1


@dataclass
class HungCardsResult:
    hold_seconds: float
    calls: CallStats
    xid_to_hook_seconds: float | None
    xid_to_watch_seconds: float | None
    threads_before: int
    threads_during: int
    healthz: tuple[int, str]
    grpc_health: dict[str, str]
    stop_seconds: float | None
    exit_code: int | None
    log_tail: str


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def hook_server(socket_path: Path) -> Iterator[RecordingHook]:
    hook = RecordingHook()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    hook_pb2_grpc.add_ReplacementHookServicer_to_server(hook, server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        yield hook
    finally:
        server.stop(0)


class Daemon:
    def __init__(self, tmp: Path, hook_socket: Path, *, reconcile_seconds: float) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.socket = tmp / "healthd.sock"
        self.admin = tmp / "healthd-admin.sock"
        config = tmp / "healthd.toml"
        config.write_text(
            "[sampler]\ninterval_seconds = 1.0\n"
            f'[hook]\nendpoints = ["unix:{hook_socket}"]\nbackoff_initial_seconds = 0.2\nbackoff_max_seconds = 1.0\n'
            f"[partitions]\nreconcile_interval_seconds = {reconcile_seconds}\n"
            f'[daemon]\nadmin_socket = "{self.admin}"\n'
        )
        self.log_path = tmp / "daemon.log"
        self.args = [
            sys.executable, "-m", "healthd", "--config", str(config), "--simulate", "h200x8",
            "--metrics-listen", f"127.0.0.1:{self.port}", "--grpc-listen", f"unix:{self.socket}",
            "--state-dir", str(tmp / "state"),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if http_get(self.port, "/healthz")[0] == 200 and self.admin.exists():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"daemon not ready in {timeout}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def terminate(self, limit: float) -> tuple[float | None, int | None]:
        """SIGTERM; (seconds to exit, exit code), or (None, None) when it did not exit within ``limit``."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            return None, None
        return time.monotonic() - started, code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(AttributeError):
            self._log.close()


def _lease() -> Any:
    return ppb.Owner(lease=ppb.LeaseOwner(holder="hung-cards-bench", ttl_seconds=600))


def setup_cards(admin: grpc.Channel) -> None:
    parts = ppb_grpc.PartitionsStub(admin)
    for gpu in MIG_CARDS:
        parts.SetCardMode(ppb.SetCardModeRequest(gpu=str(gpu), mode=ppb.PARTITION_MODE_MIG), timeout=CALL_DEADLINE)
    for gpu in (HEALTHY_TDM_CARD, TDM_HUNG_CARD):
        parts.SetCardMode(ppb.SetCardModeRequest(gpu=str(gpu), mode=ppb.PARTITION_MODE_TDM), timeout=CALL_DEADLINE)
    parts.CreatePartition(
        ppb.CreatePartitionRequest(owner=_lease(), gpu=str(TDM_HUNG_CARD), compute_percent=30, memory="2GiB"),
        timeout=CALL_DEADLINE,
    )
    parts.CreatePartition(
        ppb.CreatePartitionRequest(owner=_lease(), gpu=str(MIG_CARDS[0]), compute_percent=10, memory="10GiB"),
        timeout=CALL_DEADLINE,
    )


def inject_hangs(admin: grpc.Channel) -> None:
    sim = spb_grpc.SimulationStub(admin)
    for gpu in MIG_CARDS:
        sim.InjectFault(spb.InjectFaultRequest(kind="hang", gpu=gpu, params={"call": "mig_instances"}), timeout=10)
    sim.InjectFault(spb.InjectFaultRequest(kind="hang", gpu=TDM_HUNG_CARD, params={"call": "*"}), timeout=10)


def _timed(stats: CallStats, name: str, fn: Callable[[], object]) -> None:
    started = time.monotonic()
    error = None
    try:
        fn()
    except grpc.RpcError as exc:
        error = exc.code().name if exc.code() is not None else "error"
    stats.note(name, time.monotonic() - started, error)


def client_loop(main: grpc.Channel, admin: grpc.Channel, stats: CallStats, until: float) -> None:
    health = hpb_grpc.HealthStub(main)
    topology = tpb_grpc.TopologyStub(main)
    reads = ppb_grpc.PartitionsStub(main)
    writes = ppb_grpc.PartitionsStub(admin)
    std_health = health_pb2_grpc.HealthStub(main)
    healthy = [str(i) for i in range(8) if i not in (*MIG_CARDS, TDM_HUNG_CARD)]

    created: list[str] = []

    def create() -> None:
        part = writes.CreatePartition(
            ppb.CreatePartitionRequest(owner=_lease(), gpu=str(HEALTHY_TDM_CARD), compute_percent=10, memory="1GiB"),
            timeout=CALL_DEADLINE,
        )
        created.append(part.id)

    def delete() -> None:
        if created:
            writes.DeletePartition(ppb.DeletePartitionRequest(id=created.pop()), timeout=CALL_DEADLINE)

    calls: list[tuple[str, Callable[[], object]]] = [
        ("ListFaults", lambda: health.ListFaults(hpb.ListFaultsRequest(), timeout=CALL_DEADLINE)),
        ("GetNodeHealth", lambda: health.GetNodeHealth(hpb.GetNodeHealthRequest(), timeout=CALL_DEADLINE)),
        (
            "PreferredAllocation",
            lambda: topology.PreferredAllocation(
                tpb.PreferredAllocationRequest(count=2, available=healthy), timeout=CALL_DEADLINE
            ),
        ),
        (
            "GetCapacity(2)",
            lambda: reads.GetCapacity(ppb.GetCapacityRequest(gpu=str(HEALTHY_TDM_CARD)), timeout=CALL_DEADLINE),
        ),
        ("CreatePartition(2)", create),
        ("DeletePartition(2)", delete),
        ("grpc.health.Check", lambda: std_health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_DEADLINE)),
    ]
    while time.monotonic() < until:
        for name, fn in calls:
            _timed(stats, name, fn)
        time.sleep(0.05)


def watch_faults(main: grpc.Channel, seen: dict[str, float], stop: threading.Event) -> None:
    """Follow WatchFaults from now; note when each XID fault's record first arrives."""
    health = hpb_grpc.HealthStub(main)
    last = health.GetNodeHealth(hpb.GetNodeHealthRequest(), timeout=CALL_DEADLINE).last_seq
    while not stop.is_set():
        stream = health.WatchFaults(hpb.WatchFaultsRequest(after_seq=last))
        try:
            for message in stream:
                if stop.is_set():
                    stream.cancel()
                    return
                if message.HasField("record"):
                    last = message.record.seq
                    seen.setdefault(message.record.fault.code, time.monotonic())
        except grpc.RpcError:
            if stop.is_set():
                return
            time.sleep(0.2)


def grpc_health_statuses(main: grpc.Channel) -> dict[str, str]:
    stub = health_pb2_grpc.HealthStub(main)
    names = ["", "xpu.runtime.v1.Health", "xpu.runtime.v1.Partitions", "xpu.runtime.v1.Topology"]
    names += [f"xpu.runtime.v1.gpu/{i}" for i in range(8)]
    out = {}
    for name in names:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            out[name or "(overall)"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            out[name or "(overall)"] = exc.code().name if exc.code() is not None else "error"
    return out


def run_scenario(
    tmp: Path, *, hold_seconds: float = 120.0, reconcile_seconds: float = 1.0, stop_limit: float = 30.0
) -> HungCardsResult:
    hook_socket = tmp / "hook.sock"
    with hook_server(hook_socket) as hook:
        daemon = Daemon(tmp, hook_socket, reconcile_seconds=reconcile_seconds)
        daemon.start()
        stop_watch = threading.Event()
        main = grpc.insecure_channel(f"unix:{daemon.socket}")
        admin = grpc.insecure_channel(f"unix:{daemon.admin}")
        try:
            setup_cards(admin)
            time.sleep(2.0)  # a reconcile pass and a few sampling cycles in the set-up state
            threads_before = proc_status_kib(daemon.pid, "Threads")
            watched: dict[str, float] = {}
            watcher = threading.Thread(target=watch_faults, args=(main, watched, stop_watch), daemon=True)
            watcher.start()
            inject_hangs(admin)
            started = time.monotonic()
            stats = CallStats()
            clients = threading.Thread(
                target=client_loop, args=(main, admin, stats, started + hold_seconds), daemon=True
            )
            clients.start()
            time.sleep(hold_seconds / 2)
            injected = time.monotonic()
            spb_grpc.SimulationStub(admin).InjectFault(
                spb.InjectFaultRequest(kind="xid", gpu=XID_CARD, params={"code": "79"}), timeout=10
            )
            arrived = hook.wait_for(lambda r: r.gpu_index == XID_CARD and r.code == "xid_79", hold_seconds)
            clients.join()
            stop_watch.set()
            threads_during = proc_status_kib(daemon.pid, "Threads")
            healthz = http_get(daemon.port, "/healthz")
            statuses = grpc_health_statuses(main)
            watch_at = watched.get("xid_79")
            main.close()
            admin.close()
            stop_seconds, code = daemon.terminate(limit=stop_limit)
            return HungCardsResult(
                hold_seconds=hold_seconds,
                calls=stats,
                xid_to_hook_seconds=None if arrived is None else arrived - injected,
                xid_to_watch_seconds=None if watch_at is None else watch_at - injected,
                threads_before=threads_before,
                threads_during=threads_during,
                healthz=healthz,
                grpc_health=statuses,
                stop_seconds=stop_seconds,
                exit_code=code,
                log_tail=daemon.log_tail(),
            )
        finally:
            stop_watch.set()
            daemon.kill()


def report(result: HungCardsResult) -> str:
    lines = [
        f"hung: GPUs {MIG_CARDS} in mig_instances, GPU {TDM_HUNG_CARD} in every call, for {result.hold_seconds:g}s",
        f"{'call':28} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}  failures",
    ]
    for name, values in result.calls.latencies.items():
        fails = ", ".join(f"{k} x{v}" for k, v in result.calls.failures.get(name, {}).items()) or "-"
        lines.append(
            f"{name:28} {len(values):5d} {1000 * statistics.median(values):9.1f} "
            f"{1000 * percentile(values, 0.99):9.1f} {1000 * max(values):9.1f}  {fails}"
        )

    def secs(v: float | None) -> str:
        return "never" if v is None else f"{v:.3f}s"

    lines += [
        f"XID 79 on GPU {XID_CARD} -> hook: {secs(result.xid_to_hook_seconds)}; "
        f"-> WatchFaults: {secs(result.xid_to_watch_seconds)}",
        f"threads: {result.threads_before} before the hangs, {result.threads_during} after {result.hold_seconds:g}s",
        f"/healthz: {result.healthz[0]} {result.healthz[1].strip()[:300]}",
        "grpc.health.v1: " + ", ".join(f"{k}={v}" for k, v in result.grpc_health.items()),
        f"SIGTERM with the hangs in place: exit code {result.exit_code} after {secs(result.stop_seconds)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=120.0, help="seconds the cards stay hung (default 120)")
    parser.add_argument("--reconcile", type=float, default=1.0, help="partition reconcile interval (default 1 s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hung-cards-", dir="/tmp") as tmp:
        result = run_scenario(Path(tmp), hold_seconds=args.hold, reconcile_seconds=args.reconcile)
    print(report(result))
    if os.environ.get("HUNG_CARDS_LOG"):
        print(result.log_tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
