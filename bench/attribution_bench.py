"""/metrics render latency with and without process/pod attribution (headline: 8 GPUs, 400 processes, 100 pods).

Everything is real except the GPUs: a simulated node (``bench.scenarios.scaled``) carrying extra processes in pods
of about 4 (each pod's processes on one whole card, spread so cards are shared; MIG cards carry none), the
simulated node's proc tree and kubelet log directory as files (on /dev/shm where there is one), and a real gRPC
pod-resources server. Renders go through prometheus_client's text encoder, as every scrape did before /metrics was
rendered once per Snapshot through exporter/encoding.py (bench/metrics_bench.py and bench/scrape_bench.py measure
that path). Also measures the per-cycle attribution cost, which runs on the sampler thread, not in the scrape, and
the kubelet pod-resources refresh (a background thread).

    python3 bench/attribution_bench.py [--renders 300] [--gpus 8] [--pods 100] [--processes 400]
    python3 -m bench --only attribution    # every GPU count of the suite, with and without processes and pods
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from bench.common import BenchArgs, Row, median, percentile, timed
from bench.scenarios import scaled
from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.sampler import Sampler, SamplerSettings
from healthd.sim.node import SimulatedNode

NAME = "attribution"
PROCESSES_PER_POD = 4
WARMUP = 3  # renders of each registry before timing starts
FIRST_PID = 100_000


@dataclass
class Samples:
    """Seconds, for one node."""

    gpus: int
    processes: int  # GPU processes attributed (what the node really had), not what was asked for
    pods: int
    allocations: int = 0
    unattributed: int = 0
    plain: list[float] = field(default_factory=list)  # /metrics render without attribution
    full: list[float] = field(default_factory=list)  # with the process and pod collectors
    body_plain: int = 0
    body_full: int = 0
    collect: list[float] = field(default_factory=list)  # the process and pod collectors building their families
    cold: float = 0.0  # the first attribution of this node
    warm: list[float] = field(default_factory=list)  # attribution per sampling cycle afterwards
    kubelet: float = 0.0  # one pod-resources refresh


def place(backend: SimulatedBackend, processes: int, pods: int) -> None:
    """``processes`` processes in ``pods`` pods (spread evenly), each pod's processes on one whole card."""
    cards = backend.scenario.cards
    whole = [i for i, card in enumerate(cards) if not card.mig_enabled] or list(range(len(cards)))
    for i in range(processes):
        pod = i * pods // processes if pods else -1
        gpu = whole[(pod if pod >= 0 else i) % len(whole)]
        params = {"pid": str(FIRST_PID + i), "name": f"worker-{i % 7}", "memory_mib": str(64 + i % 512)}
        if pod >= 0:
            params.update({"pod": f"job-{pod}", "namespace": f"team-{pod % 5}", "container": f"c{i % 4}"})
        backend.inject("process_start", gpu, params)


def node_dir(work_dir: Path | None) -> Path | None:
    """Where the simulated node's proc tree and kubelet logs go: tmpfs where there is one, as /proc is in memory
    on a real node (on this VM's disk, writing 3,200 processes' files took longer than the measuring)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else work_dir


def measure(
    gpus: int, processes: int, pods: int, renders: int, cycles: int = 50, work_dir: Path | None = None
) -> Samples:
    backend = SimulatedBackend(scaled(gpus))
    place(backend, processes, pods)
    with tempfile.TemporaryDirectory(prefix="xpu-bench-", dir=node_dir(work_dir)) as tmp:
        sim = SimulatedNode(backend, Path(tmp) / "node")
        sim.kubelet.socket_path = Path(tmp) / "k.sock"
        sampler = Sampler(backend, SamplerSettings(interval_seconds=3600, call_deadline_seconds=10))
        kubelet = KubeletPodResources(sim.kubelet.socket_path, refresh_interval=3600)
        attributor = Attributor(ProcResolver(sim.proc_root), pod_index=PodLogIndex(sim.log_root), kubelet=kubelet)
        sim.start()
        try:
            snap = sampler.run_once()
            t0 = time.perf_counter()
            kubelet.refresh()
            kubelet_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            attribution = attributor.update(snap)
            cold_s = time.perf_counter() - t0
            warm = timed(lambda: attributor.update(snap), cycles)

            plain = CollectorRegistry(auto_describe=False)
            plain.register(SnapshotExporter(sampler.latest, default_collectors()))
            full = CollectorRegistry(auto_describe=False)
            full.register(
                SnapshotExporter(
                    sampler.latest,
                    [*default_collectors(), ProcessCollector(attributor.latest), PodCollector(attributor.latest)],
                )
            )
            body_plain, body_full = generate_latest(plain), generate_latest(full)
            proc_c, pod_c = ProcessCollector(attributor.latest), PodCollector(attributor.latest)
            t_collect = timed(lambda: (list(proc_c.collect(snap, 0.0)), list(pod_c.collect(snap, 0.0))), renders)
            for _ in range(WARMUP):
                generate_latest(plain)
                generate_latest(full)
            # interleave so both see the same machine load
            t_plain: list[float] = []
            t_full: list[float] = []
            for _ in range(renders):
                t_plain += timed(lambda: generate_latest(plain), 1)
                t_full += timed(lambda: generate_latest(full), 1)
        finally:
            kubelet.stop()
            sim.stop()
            sampler.stop()

    return Samples(
        gpus=gpus,
        processes=len(attribution.processes),
        pods=len({(p.workload.namespace, p.workload.pod) for p in attribution.processes if p.workload.pod}),
        allocations=len(attribution.allocations),
        unattributed=sum(1 for p in attribution.processes if not p.workload.pod),
        plain=t_plain,
        full=t_full,
        body_plain=len(body_plain),
        body_full=len(body_full),
        collect=t_collect,
        cold=cold_s,
        warm=warm,
        kubelet=kubelet_s,
    )


def rows(s: Samples, renders_note: str = "") -> list[Row]:
    ms = 1e3
    renders_note = renders_note or f"{len(s.plain)} renders"

    def row(metric: str, unit: str, value: float, note: str = "") -> Row:
        return Row(metric, unit, value, s.gpus, s.processes, s.pods, note)

    ratio = median(s.full) / median(s.plain) if s.plain and median(s.plain) > 0 else float("nan")
    return [
        row("/metrics render p50 without attribution", "ms", median(s.plain) * ms, renders_note),
        row("/metrics render p99 without attribution", "ms", percentile(s.plain, 0.99) * ms),
        row("/metrics render p50 with attribution", "ms", median(s.full) * ms, "4 processes per pod"),
        row("/metrics render p99 with attribution", "ms", percentile(s.full, 0.99) * ms),
        row("  with / without (p50)", "x", ratio),
        row("  process+pod collectors p50", "ms", median(s.collect) * ms, "part of the render"),
        row("  body without attribution", "KiB", s.body_plain / 1024),
        row("  body with attribution", "KiB", s.body_full / 1024),
        row("attribution per cycle p50 (warm)", "ms", median(s.warm) * ms, "sampler thread"),
        row("attribution per cycle p99 (warm)", "ms", percentile(s.warm, 0.99) * ms),
        row("  first attribution (cold)", "ms", s.cold * ms),
        row("kubelet pod-resources refresh", "ms", s.kubelet * ms, "background thread"),
    ]


def run(args: BenchArgs) -> list[Row]:
    renders = 40 if args.quick else 300
    cycles = 10 if args.quick else 50
    note = f"{renders} renders (x 8/GPUs above 8 GPUs)"
    out: list[Row] = []
    for per_gpu in args.processes_per_gpu:
        for gpus in args.gpu_counts:
            processes = gpus * per_gpu
            pods = processes // PROCESSES_PER_POD  # 50 per GPU on 8 GPUs: 400 processes, 100 pods
            scale = 8 / max(gpus, 8)  # keep the 64-GPU points from dominating the run
            s = measure(gpus, processes, pods, max(5, int(renders * scale)), max(5, int(cycles * scale)), args.work_dir)
            out += rows(s, note)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--processes", type=int, default=400)
    args = ap.parse_args(argv)
    s = measure(args.gpus, args.processes, args.pods, args.renders)
    print(f"node: {s.gpus} GPUs, {s.processes} GPU processes, {s.pods} pods, {s.allocations} allocations")
    print(f"unattributed processes: {s.unattributed}")
    for label, samples, body in (
        ("without attribution", s.plain, s.body_plain),
        ("with attribution", s.full, s.body_full),
    ):
        print(
            f"/metrics render {label:20}: p50 {median(samples) * 1e3:7.2f} ms"
            f"  p99 {percentile(samples, 0.99) * 1e3:7.2f} ms  ({body / 1024:.0f} KiB)"
        )
    print(
        f"  of which process+pod collectors building families: p50 {median(s.collect) * 1e3:.2f} ms"
        f" p99 {percentile(s.collect, 0.99) * 1e3:.2f} ms"
    )
    print(f"ratio with/without (p50): {statistics.median(s.full) / statistics.median(s.plain):.2f}x")
    print(f"attribution per sampling cycle (sampler thread): cold {s.cold * 1e3:.1f} ms,", end=" ")
    print(f"warm p50 {median(s.warm) * 1e3:.2f} ms p99 {percentile(s.warm, 0.99) * 1e3:.2f} ms")
    print(f"kubelet pod-resources refresh (background thread): {s.kubelet * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
