"""xpu-device-plugin: Allocate latency, health flip latency and the plugin's memory, as kubelet sees them.

Starts a simulated 8-card xpu-healthd, the plugin as a process and the kubelet test double
(tests/support/kubelet_double.py, real v1beta1 and pod-resources protos on unix sockets). Times, from the kubelet side:
- Allocate of one whole card (CDI names from the cached view; no daemon call on this path);
- Allocate of one MIG 1g.18gb slice (CreatePartition on the daemon, then a fresh view);
- health flip: an injected XID 79 until kubelet's ListAndWatch stream shows the card Unhealthy, and the operator's
  ResolveFault until it shows Healthy again;
and reads the plugin's resident memory and CPU time at the end.

    python3 bench/deviceplugin_bench.py [--rounds 30]
    python3 -m bench --only deviceplugin
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(REPO))

from bench.common import BenchArgs, Row, percentile, proc_cpu_seconds, proc_status_kib  # noqa: E402
from healthd.api.v1 import health_pb2 as hpb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as hpb_grpc  # noqa: E402
from healthd.api.v1 import partitions_pb2 as ppb  # noqa: E402
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc  # noqa: E402
from healthd.api.v1 import simulation_pb2 as spb  # noqa: E402
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc  # noqa: E402

NAME = "deviceplugin"
GPU = "xpu-runtime-kit.io/gpu"
MIG = "xpu-runtime-kit.io/mig-1g.18gb"
FLIP_LIMIT_SECONDS = 30.0
# each flip is a new XID 79 on a card that had one a moment ago: a short merge window keeps them apart
MERGE_WINDOW = "[health.xid]\nmerge_window_seconds = 0.001\n"


@dataclass
class Samples:
    allocate_card: list[float] = field(default_factory=list)
    allocate_mig: list[float] = field(default_factory=list)
    unhealthy: list[float] = field(default_factory=list)
    healthy: list[float] = field(default_factory=list)
    rss_mib: float = 0.0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0


def _seen_at(kubelet: object, device: str, health: str, since: float) -> float | None:
    """When the kubelet double first received a list with ``device`` in ``health`` after ``since``."""
    for at, devices in kubelet.plugin(GPU).updates:  # type: ignore[attr-defined]
        if at >= since and any(device == d.ID and d.health == health for d in devices):
            return float(at)
    return None


def _wait_seen(kubelet: object, device: str, health: str, since: float) -> float:
    deadline = time.monotonic() + FLIP_LIMIT_SECONDS
    while time.monotonic() < deadline:
        at = _seen_at(kubelet, device, health, since)
        if at is not None:
            return at - since
        time.sleep(0.002)
    updates = [(round(at - since, 3), [d.health for d in devs]) for at, devs in kubelet.plugin(GPU).updates[-3:]]  # type: ignore[attr-defined]
    raise RuntimeError(f"{device} never became {health} within {FLIP_LIMIT_SECONDS}s; last lists: {updates}")


def measure(rounds: int, work_dir: Path) -> Samples:
    from tests.kubernetes.stack import stack

    s = Samples()
    with (
        tempfile.TemporaryDirectory(dir=work_dir, prefix="xdp-bench-") as tmp,
        stack(Path(tmp), scenario="h200x8", daemon_extra=MERGE_WINDOW) as (daemon, kubelet, plugin),
    ):
        started = time.monotonic()
        admin = grpc.insecure_channel(f"unix:{daemon.socket.parent / 'healthd-admin.sock'}")
        main = grpc.insecure_channel(daemon.address)
        partitions = ppb_grpc.PartitionsStub(admin)  # type: ignore[no-untyped-call]
        health_admin = hpb_grpc.HealthStub(admin)  # type: ignore[no-untyped-call]
        health = hpb_grpc.HealthStub(main)  # type: ignore[no-untyped-call]
        simulation = spb_grpc.SimulationStub(admin)  # type: ignore[no-untyped-call]
        partitions.SetCardMode(ppb.SetCardModeRequest(gpu="6", mode=ppb.PARTITION_MODE_MIG), timeout=10)
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 6 and len(kubelet.healthy(MIG)) == 7, "plugin ready")
        cards = sorted(kubelet.healthy(GPU))
        for i in range(rounds):
            t0 = time.perf_counter()
            kubelet.allocate(GPU, [cards[i % len(cards)]])
            s.allocate_card.append(time.perf_counter() - t0)
        for i in range(rounds):
            slot = kubelet.healthy(MIG)[i % 7]
            t0 = time.perf_counter()
            response = kubelet.allocate(MIG, [slot])
            s.allocate_mig.append(time.perf_counter() - t0)
            partition = response.envs["XPU_PARTITION_ID"]
            partitions.DeletePartition(ppb.DeletePartitionRequest(id=partition), timeout=10)
            kubelet.wait(lambda: len(kubelet.healthy(MIG)) == 7, "slot free again")
        capacity = partitions.GetCapacity(ppb.GetCapacityRequest(), timeout=10).cards
        uuid_of = {c.gpu: c.gpu_uuid for c in capacity}
        for i in range(rounds):
            index = i % 6  # the whole cards (6 and 7 have MIG on)
            uuid = uuid_of[index]
            since = time.monotonic()
            simulation.InjectFault(spb.InjectFaultRequest(kind="xid", gpu=index, params={"code": "79"}), timeout=10)
            s.unhealthy.append(_wait_seen(kubelet, uuid, "Unhealthy", since))
            active = health.ListFaults(
                hpb.ListFaultsRequest(gpu=str(index), state=hpb.FAULT_STATE_ACTIVE), timeout=10
            ).faults
            since = time.monotonic()
            for f in active:
                health_admin.ResolveFault(hpb.ResolveFaultRequest(id=f.id, reason="bench"), timeout=10)
            s.healthy.append(_wait_seen(kubelet, uuid, "Healthy", since))
        assert plugin.proc is not None
        s.rss_mib = proc_status_kib(plugin.proc.pid, "VmRSS") / 1024
        s.cpu_seconds = proc_cpu_seconds(plugin.proc.pid)
        s.wall_seconds = time.monotonic() - started
        admin.close()
        main.close()
    return s


def rows(s: Samples) -> list[Row]:
    out = []
    for metric, values in (
        ("plugin Allocate, 1 whole card", s.allocate_card),
        ("plugin Allocate, 1 MIG 1g.18gb (creates it)", s.allocate_mig),
        ("XID 79 -> kubelet sees Unhealthy", s.unhealthy),
        ("ResolveFault -> kubelet sees Healthy", s.healthy),
    ):
        ms = [v * 1000 for v in values]
        out.append(Row(f"{metric} p50", "ms", percentile(ms, 0.5), gpus=8, note=f"n={len(ms)}"))
        out.append(Row(f"{metric} p99", "ms", percentile(ms, 0.99), gpus=8))
    out.append(Row("plugin resident memory", "MiB", s.rss_mib, gpus=8))
    out.append(Row("plugin CPU while measured", "s", s.cpu_seconds, gpus=8, note=f"over {s.wall_seconds:.0f}s"))
    return out


def run(args: BenchArgs) -> list[Row]:
    return rows(measure(10 if args.quick else 30, args.work_dir))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    opts = ap.parse_args(argv)
    s = measure(opts.rounds, Path(tempfile.gettempdir()))
    for row in rows(s):
        print(f"{row.metric:48} {row.value:9.2f} {row.unit:4} {row.note}")
    print(f"{'mean flip to Unhealthy':48} {statistics.fmean(s.unhealthy) * 1000:9.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
