"""/metrics cost as the node grows: the render per Snapshot, HTTP scrape latency p50/p99, series and body size.

/metrics is built as the daemon builds it (``SnapshotRenderer`` over ``default_collectors()``, served through an
``ExpositionCache``), on a generated node. "Render per Snapshot" is what the daemon does once per sampling cycle
for a Prometheus scraper: the collectors write their series (exporter/collectors/render.py), OpenMetrics is encoded
(exporter/encoding.py) and gzipped, on a new Snapshot each time.
Scrapes go over one kept-alive HTTP/1.1 connection with the headers Prometheus sends (OpenMetrics first, gzip), as a
Prometheus server would, between Snapshots: they are served the rendered bytes. The process count reaches /metrics
only through the collectors that export per-process series; in a tree without them the curve over processes is flat.
"""

from __future__ import annotations

import http.client
import time

from bench.common import BenchArgs, Row, median, percentile
from bench.scenarios import scaled
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, default_collectors
from exporter.collectors.render import SnapshotRenderer
from exporter.exposition import ExpositionCache
from exporter.http import Health, MetricsHTTPServer
from exporter.sampler import Sampler, SamplerSettings

NAME = "metrics"
WARMUP = 3  # renders and scrapes before timing starts

# What Prometheus 3.x sends on a scrape (scrape_protocols default order) and its gzip request.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}


def collectors() -> list[Collector]:
    """The daemon's collector list (the one place to adapt if building it ever needs arguments)."""
    return default_collectors()


def scrape_latencies(
    port: int, scrapes: int, headers: dict[str, str] = PROMETHEUS_HEADERS
) -> tuple[list[float], bytes]:
    """Seconds per scrape over one kept-alive connection (after WARMUP more), and the last body as sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    body = b""
    try:
        for i in range(WARMUP + scrapes):
            t = time.perf_counter()
            conn.request("GET", "/metrics", headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            elapsed = time.perf_counter() - t
            if resp.status != 200:
                raise RuntimeError(f"/metrics answered {resp.status}")
            if i >= WARMUP:
                times.append(elapsed)
    finally:
        conn.close()
    return times, body


def measure(gpus: int, processes_per_gpu: int, scrapes: int) -> list[Row]:
    sim = SimulatedBackend(scaled(gpus, processes_per_gpu))
    sim.open()
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5.0, call_deadline_seconds=2.0))
    server: MetricsHTTPServer | None = None
    try:
        sampler.run_once()
        cache = ExpositionCache(SnapshotRenderer(collectors()), max_age=3600.0)  # every publish renders what was asked
        cache.payload(PROMETHEUS_ACCEPT, "gzip")  # Prometheus' format is now asked for
        render: list[float] = []
        for i in range(WARMUP + scrapes):
            snap = sampler.run_once()  # values move, as between two cycles
            t = time.perf_counter()
            cache.publish(snap)
            if i >= WARMUP:
                render.append(time.perf_counter() - t)
        body = cache.payload("").body  # text format, for counting
        server = MetricsHTTPServer(("127.0.0.1", 0), cache, health=lambda: Health(True, "ok"))
        server.start()
        latencies, gz = scrape_latencies(server.port, scrapes)
    finally:
        if server is not None:
            server.stop()
        sampler.stop()
        sim.close()
    lines = body.decode().splitlines()
    series = sum(1 for line in lines if line and not line.startswith("#"))
    procs = gpus * processes_per_gpu
    note = f"{scrapes} scrapes"
    return [
        Row("/metrics scrape p50", "ms", median(latencies) * 1e3, gpus, procs, note=note),
        Row("/metrics scrape p99", "ms", percentile(latencies, 0.99) * 1e3, gpus, procs, note=note),
        Row("  render per Snapshot p50 (collect, OpenMetrics, gzip)", "ms", median(render) * 1e3, gpus, procs),
        Row("  render per Snapshot p99", "ms", percentile(render, 0.99) * 1e3, gpus, procs),
        Row("  series", "", float(series), gpus, procs),
        Row("  body", "KiB", len(body) / 1024, gpus, procs),
        Row("  body gzip", "KiB", len(gz) / 1024, gpus, procs),
    ]


def run(args: BenchArgs) -> list[Row]:
    rows: list[Row] = []
    for per_gpu in args.processes_per_gpu:
        for gpus in args.gpu_counts:
            scrapes = max(50, args.scrapes * 8 // max(gpus, 8))
            rows += measure(gpus, per_gpu, scrapes)
    return rows
