"""Foundation benchmark: sampler cost per GPU per cycle, /metrics latency, resident memory.

Run: python3 bench/foundation_bench.py [--processes-per-gpu 50] [--cycles 200] [--scrapes 300]

Numbers are ratios against baselines measured in the same process where possible (this machine is noisy):
- sampler overhead: a full Sampler cycle vs the same backend calls made directly, one after another;
- /metrics: an HTTP scrape of the daemon's registry vs rendering the same registry without HTTP.
The simulated backend costs microseconds per call; on real NVML add the driver's own cost (see
shared/fixtures/h200: about 4-5 ms per card per cycle for the calls this daemon makes).
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.http import Health, MetricsHTTPServer
from exporter.sampler import Sampler, SamplerConfig


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build(processes_per_gpu: int) -> SimulatedBackend:
    sim = SimulatedBackend.from_name("h200x8")
    sim.open()
    pid = 100_000
    for gpu in range(sim.device_count()):
        for _ in range(processes_per_gpu):
            pid += 1
            sim.inject("process_start", gpu, {"pid": str(pid), "memory_mib": "256", "load": "0.01"})
    return sim


def bench_sampler(sim: SimulatedBackend, cycles: int) -> dict[str, float]:
    gpus = sim.device_count()
    sampler = Sampler(sim, SamplerConfig(interval_seconds=1.0, call_deadline_seconds=2.0))
    sampler.run_once()
    # baseline: the same calls, made directly on this thread
    cpu0 = time.process_time()
    for _ in range(cycles):
        for i in range(gpus):
            sim.sample(i)
            sim.processes(i)
            sim.mig_instances(i)
    direct_cpu = (time.process_time() - cpu0) / (cycles * gpus)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(cycles):
        sampler.run_once()
    sampler_cpu = (time.process_time() - cpu0) / (cycles * gpus)
    wall = (time.perf_counter() - wall0) / cycles
    sampler.stop()
    return {
        "direct_cpu_per_gpu_ms": direct_cpu * 1e3,
        "sampler_cpu_per_gpu_ms": sampler_cpu * 1e3,
        "cycle_wall_ms": wall * 1e3,
    }


def bench_scrape(sim: SimulatedBackend, scrapes: int) -> dict[str, float]:
    sampler = Sampler(sim, SamplerConfig(interval_seconds=1.0, call_deadline_seconds=2.0))
    sampler.run_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler.latest, default_collectors()))
    render = []
    for _ in range(scrapes):
        t = time.perf_counter()
        body = generate_latest(registry)
        render.append(time.perf_counter() - t)
    server = MetricsHTTPServer(("127.0.0.1", 0), registry, health=lambda: Health(True, "ok"))
    server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    http = []
    for _ in range(scrapes):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        http.append(time.perf_counter() - t)
    server.stop()
    sampler.stop()
    return {
        "render_p50_ms": statistics.median(render) * 1e3,
        "render_p99_ms": pct(render, 0.99) * 1e3,
        "http_p50_ms": statistics.median(http) * 1e3,
        "http_p99_ms": pct(http, 0.99) * 1e3,
        "body_kib": len(body) / 1024,
        "series": float(sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes-per-gpu", type=int, default=50)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--scrapes", type=int, default=300)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    gc.collect()
    rss_start = rss_mib()
    rows = []
    for per_gpu in (0, args.processes_per_gpu):
        sim = build(per_gpu)
        s = bench_sampler(sim, args.cycles)
        m = bench_scrape(sim, args.scrapes)
        rows.append((per_gpu * sim.device_count(), s, m))
        sim.clear()
    print("xpu-runtime-kit foundation benchmark (simulated h200x8, 8 GPUs)")
    print(
        f"{'procs':>6} {'direct cpu/gpu':>15} {'sampler cpu/gpu':>16} {'overhead':>9} {'cycle wall':>11} "
        f"{'render p50/p99':>16} {'http p50/p99':>15} {'series':>7} {'KiB':>6}"
    )
    for procs, s, m in rows:
        ratio = s["sampler_cpu_per_gpu_ms"] / max(s["direct_cpu_per_gpu_ms"], 1e-9)
        print(
            f"{procs:>6} {s['direct_cpu_per_gpu_ms']:>12.3f} ms {s['sampler_cpu_per_gpu_ms']:>13.3f} ms "
            f"{ratio:>8.2f}x {s['cycle_wall_ms']:>8.2f} ms "
            f"{m['render_p50_ms']:>6.2f}/{m['render_p99_ms']:<6.2f}ms "
            f"{m['http_p50_ms']:>6.2f}/{m['http_p99_ms']:<6.2f}ms {m['series']:>7.0f} {m['body_kib']:>6.1f}"
        )
    print(f"resident memory: {rss_mib():.1f} MiB (process start {rss_start:.1f} MiB, includes Python and libraries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
