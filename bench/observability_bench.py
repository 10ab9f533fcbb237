"""Observability benchmark: what the dcgm-compat series and the status page cost per scrape / page view.

Run: python3 bench/observability_bench.py [--repeat 300]

Prints medians for the simulated 8x H200 node: rendering /metrics with the default collectors, with the dcgm-compat
collector added (and the extra bytes), and rendering the status page. All of it is Python over an immutable
Snapshot; no driver call is made while rendering.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.status_page import render_status_page


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def registry(snapshot: Snapshot, collectors: list[Collector]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotExporter(lambda: snapshot, collectors))
    return reg


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=300)
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    sampler = Sampler(backend, SamplerSettings(1.0, 1.0))
    snapshot = sampler.run_once()
    sampler.stop()

    base = registry(snapshot, default_collectors())
    compat = registry(snapshot, [*default_collectors(), DcgmCompatCollector("node-a")])
    dcgm_only = DcgmCompatCollector("node-a")
    base_bytes, compat_bytes = len(generate_latest(base)), len(generate_latest(compat))
    # interleaved, so load from other processes on the machine hits both alike
    base_ms, compat_ms = [], []
    for _ in range(args.repeat):
        base_ms.append(median_ms(lambda: generate_latest(base), 1))
        compat_ms.append(median_ms(lambda: generate_latest(compat), 1))
    collect_ms = median_ms(lambda: list(dcgm_only.collect(snapshot, snapshot.taken_at)), args.repeat)
    page_ms = median_ms(lambda: render_status_page(snapshot, hostname="node-a"), args.repeat)
    page_kib = len(render_status_page(snapshot, hostname="node-a").encode()) / 1024
    print(f"node: {len(snapshot.gpus)} GPUs (simulated h200x8), {args.repeat} repetitions, medians")
    print(f"/metrics render, default collectors: {statistics.median(base_ms):7.2f} ms {base_bytes / 1024:7.1f} KiB")
    print(f"/metrics render, with dcgm_compat:   {statistics.median(compat_ms):7.2f} ms {compat_bytes / 1024:7.1f} KiB")
    print(f"dcgm_compat collect() alone:         {collect_ms:7.2f} ms")
    print(f"status page render:                  {page_ms:7.2f} ms {page_kib:7.1f} KiB")
    backend.close()


if __name__ == "__main__":
    main()
