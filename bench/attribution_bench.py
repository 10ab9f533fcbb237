"""/metrics render latency with and without process/pod attribution: 8 GPUs, 400 processes, 100 pods.

Everything is real except the GPUs: a simulated h200x8 node carrying 400 extra processes in 100 pods (4 each,
spread so cards are shared), the simulated node's proc tree and kubelet log directory on disk, and a real gRPC
pod-resources server. Renders go through prometheus_client's text encoder, as a scrape does. Also prints the
per-cycle attribution cost, which runs on the sampler thread, not in the scrape.

    python3 bench/attribution_bench.py [--renders 300] [--pods 100] [--processes 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.sampler import Sampler, SamplerConfig
from healthd.sim_attribution import SimulatedNode


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return p50 * 1000, p99 * 1000


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=300)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--processes", type=int, default=400)
    args = ap.parse_args()

    backend = SimulatedBackend.from_name("h200x8")
    gpus = len(backend.scenario.cards)
    per_pod = max(1, args.processes // args.pods)
    for i in range(args.processes):
        pod = i // per_pod
        gpu = pod % gpus  # a pod's processes on one card; ~pods/gpus pods share each card
        params = {"pid": str(100000 + i), "name": f"worker-{i % 7}", "memory_mib": str(64 + i % 512)}
        params.update({"pod": f"job-{pod}", "namespace": f"team-{pod % 5}", "container": f"c{i % per_pod}"})
        if gpu >= 6:  # cards 6 and 7 are MIG-enabled in this scenario: use whole-card cards only
            gpu = gpu % 6
        backend.inject("process_start", gpu, params)

    with tempfile.TemporaryDirectory(prefix="xpu-bench-", dir="/tmp") as tmp:
        sim = SimulatedNode(backend, Path(tmp) / "node")
        sim.kubelet.socket_path = Path(tmp) / "k.sock"
        sampler = Sampler(backend, SamplerConfig(interval_seconds=3600, call_deadline_seconds=10))
        kubelet = KubeletPodResources(sim.kubelet.socket_path, refresh_interval=3600)
        attributor = Attributor(ProcResolver(sim.proc_root), pod_index=PodLogIndex(sim.log_root), kubelet=kubelet)
        sim.start()
        try:
            snap = sampler.run_once()
            sim.sync()
            t0 = time.perf_counter()
            kubelet.refresh()
            kubelet_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            attribution = attributor.update(snap)
            cold_s = time.perf_counter() - t0
            warm = timed(lambda: attributor.update(snap), 50)

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
            t_collect = timed(lambda: (list(proc_c.collect(snap, 0.0)), list(pod_c.collect(snap, 0.0))), 100)
            for _ in range(20):  # warm-up
                generate_latest(plain)
                generate_latest(full)
            # interleave so both see the same machine load
            t_plain: list[float] = []
            t_full: list[float] = []
            for _ in range(args.renders):
                t_plain += timed(lambda: generate_latest(plain), 1)
                t_full += timed(lambda: generate_latest(full), 1)
        finally:
            kubelet.stop()
            sim.stop()
            sampler.stop()

    processes = len(attribution.processes)
    pods = len({(p.workload.namespace, p.workload.pod) for p in attribution.processes if p.workload.pod})
    unattributed = sum(1 for p in attribution.processes if not p.workload.pod)
    print(f"node: {gpus} GPUs, {processes} GPU processes, {pods} pods, {len(attribution.allocations)} allocations")
    print(f"unattributed processes: {unattributed}")
    for label, samples, body in (("without attribution", t_plain, body_plain), ("with attribution", t_full, body_full)):
        p50, p99 = percentiles(samples)
        print(f"/metrics render {label:20}: p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  ({len(body) / 1024:.0f} KiB)")
    cp50, cp99 = percentiles(t_collect)
    print(f"  of which process+pod collectors building families: p50 {cp50:.2f} ms p99 {cp99:.2f} ms")
    print(f"ratio with/without (p50): {statistics.median(t_full) / statistics.median(t_plain):.2f}x")
    wp50, wp99 = percentiles(warm)
    print(f"attribution per sampling cycle (sampler thread): cold {cold_s * 1000:.1f} ms,", end=" ")
    print(f"warm p50 {wp50:.2f} ms p99 {wp99:.2f} ms")
    print(f"kubelet pod-resources refresh (background thread): {kubelet_s * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
