"""Scrapes that land on a publish render, with and without the render giving way to them, in one process.

The daemon's /metrics stack (exporter/http.py's server, the exposition cache, the block-cached renderer over the
busy node's collectors and attribution, as bench/exposition_render.py builds it) serves a scraper in another
process, which asks for Prometheus' format (OpenMetrics, gzip) every ``--gap`` seconds, every other time on a new
connection (a new or restarted scraper's first request is one). Meanwhile a publisher thread renders without pause
(a few Snapshots taken in turn, so every card's and pod's block changes at each render; the heap settled as the
daemon's is at READY), so nearly every scrape
lands on a render: the worst case of a daemon whose render takes 100-370 ms every 5 s.

Modes, interleaved in rounds (each round runs every mode once, in a shuffled order, for ``--scrapes`` scrapes):
``idle`` (no render runs: the floor this machine's scheduling leaves), ``off`` (renders; the server gives no way,
Python's switch interval), ``switch`` (the short switch interval, ``--short``, default
``exporter.exposition.RENDER_SWITCH_INTERVAL``, for the whole process, nothing else), ``give-way-5ms`` (the render
waits for requests in flight, the switch interval left alone), ``give-way`` (what the daemon does: both, the short
switch interval only while a publish renders). Printed per mode: the scrape latency p50/p99/max as the scraper
measured it, renders per second, and the process's CPU per render (what the shorter interval costs).

    PYTHONPATH=. .venv/bin/python bench/render_yield.py --gpus 64
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from bench.common import median, percentile
from bench.exposition_render import ACCEPT, Node
from exporter import exposition
from exporter.collectors.render import SnapshotRenderer
from exporter.exposition import PROMETHEUS_FORMATS, ExpositionCache
from exporter.http import Health, MetricsHTTPServer
from healthd.daemon.heap import settle_heap

MODES = ("idle", "off", "switch", "give-way-5ms", "give-way")

SCRAPER = r"""
import http.client, json, sys, time
port, gap, accept = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
headers = {"Accept": accept, "Accept-Encoding": "gzip"}
conn = None
for line in sys.stdin:
    out = []
    for i in range(int(line)):
        time.sleep(gap)
        new = conn is None or i % 2
        if new:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        reply = conn.getresponse()
        reply.read()
        out.append((time.perf_counter() - started, bool(new)))
    print(json.dumps(out), flush=True)
"""


class Publisher(threading.Thread):
    """Publishes the given Snapshots in turn without pause; counts renders."""

    def __init__(self, cache: ExpositionCache, snapshots: list[Any]) -> None:
        super().__init__(name="publisher", daemon=True)
        self.cache, self.snapshots = cache, snapshots
        self.renders = 0
        self.stopping = threading.Event()
        self.rendering = threading.Event()
        self.rendering.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            if not self.rendering.wait(0.1):
                continue
            self.cache.publish(self.snapshots[self.renders % len(self.snapshots)])
            self.renders += 1


def set_mode(mode: str, cache: ExpositionCache, server: MetricsHTTPServer, default: float, short: float) -> None:
    cache._requests = server.requests if mode.startswith("give-way") else None  # a probe: the bench toggles it
    exposition.RENDER_SWITCH_INTERVAL = default if mode == "give-way-5ms" else short
    sys.setswitchinterval(short if mode == "switch" else default)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scrapes", type=int, default=40, help="scrapes per mode per round")
    ap.add_argument("--gap", type=float, default=0.1, help="seconds between two scrapes")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--short", type=float, default=exposition.RENDER_SWITCH_INTERVAL, help="the short switch interval")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # the daemon's info
    modes = args.modes.split(",")
    default_interval = sys.getswitchinterval()
    with tempfile.TemporaryDirectory(prefix="xpu-bench-yield-") as tmp:
        node = Node(args.gpus, Path(tmp))
        snapshots = [node.cycle() for _ in range(3)]
        cache = ExpositionCache(SnapshotRenderer(node.collectors), max_age=3600.0, expect=PROMETHEUS_FORMATS)
        server = MetricsHTTPServer(("127.0.0.1", 0), cache, health=lambda: Health(True, "ok"))
        server.start()
        settle_heap()  # as the daemon does at READY
        publisher = Publisher(cache, snapshots)
        publisher.start()
        scraper = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, str(server.port), str(args.gap), ACCEPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert scraper.stdin is not None
        assert scraper.stdout is not None
        latencies: dict[str, list[tuple[float, bool]]] = {m: [] for m in modes}
        cpu: dict[str, float] = dict.fromkeys(modes, 0.0)
        renders: dict[str, int] = dict.fromkeys(modes, 0)
        wall: dict[str, float] = dict.fromkeys(modes, 0.0)
        try:
            for _ in range(args.rounds):
                for mode in random.sample(modes, len(modes)):
                    set_mode(mode, cache, server, default_interval, args.short)
                    if mode == "idle":
                        publisher.rendering.clear()
                    else:
                        publisher.rendering.set()
                    started, cpu0, renders0 = time.monotonic(), time.process_time(), publisher.renders
                    scraper.stdin.write(f"{args.scrapes}\n")
                    scraper.stdin.flush()
                    latencies[mode] += [(t, new) for t, new in json.loads(scraper.stdout.readline())]
                    cpu[mode] += time.process_time() - cpu0
                    renders[mode] += publisher.renders - renders0
                    wall[mode] += time.monotonic() - started
        finally:
            scraper.stdin.close()
            scraper.wait(30)
            publisher.stopping.set()
            publisher.rendering.set()
            publisher.join(30)
            server.stop()
            node.close()
            sys.setswitchinterval(default_interval)
    print(
        f"{args.gpus} busy cards, {args.rounds} rounds x {args.scrapes} scrapes per mode, a scrape every {args.gap} s,"
    )
    print(f"switch interval {default_interval * 1e3:g} ms, the short one {args.short * 1e3:g} ms")
    print(f"{'mode':14} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'new conn p99':>13} {'kept p99':>9} ", end="")
    print(f"{'renders/s':>10} {'CPU ms/render':>14}")
    for mode in modes:
        ms = [t * 1e3 for t, _ in latencies[mode]]
        new = [t * 1e3 for t, fresh in latencies[mode] if fresh]
        kept = [t * 1e3 for t, fresh in latencies[mode] if not fresh]
        per_render = cpu[mode] / renders[mode] * 1e3 if renders[mode] else float("nan")
        print(
            f"{mode:14} {median(ms):8.2f} {percentile(ms, 0.99):8.2f} {max(ms):8.2f} {percentile(new, 0.99):13.2f} "
            f"{percentile(kept, 0.99):9.2f} {renders[mode] / wall[mode]:10.2f} {per_render:14.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
