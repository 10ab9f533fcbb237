"""One tree's /metrics render, in process: CPU per render, and how often the exposition cache renders over a
scripted six minutes of scrapers. Run by bench/exposition_bench.py once per tree (this one and the baseline), as
``PYTHONPATH=<tree> python3 bench/exposition_render.py --gpus N --out FILE``: it imports ``exporter``, ``healthd``
and ``bench.scenarios`` from whichever tree PYTHONPATH names, and writes one JSON object to FILE.

The node is the daemon's: a busy simulated node (``bench.scenarios.busy_data``; at 8 GPUs h200x8-busy), its proc
tree and kubelet files and pod-resources socket, attribution, and the card, MIG, profiling, self, process and pod
collectors, wired as the tree's daemon wires them (a tree without exporter/collectors/render.py: a registry over
SnapshotExporter, as before).

1. Render CPU per cycle: a new Snapshot every cycle, each rendered for Prometheus' format (collect, OpenMetrics,
   gzip), timed on the rendering thread (``time.thread_time``: other threads, the lanes and the simulated kubelet,
   are not counted).
2. Renders over a timeline on a fake clock (real Snapshots and renders, 5 s apart): the daemon starts; a Prometheus
   scrapes every 15 s from 10 s on; a replica joins at 127 s; the first stops at 240 s and is back at 283 s; the end
   at 360 s. Counted: renders at publish and on a request's thread (a request that waited), per phase.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scenarios import busy_data
from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.scenario import parse_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.exposition import ExpositionCache
from exporter.sampler import Sampler

try:
    from exporter.sampler import SamplerSettings
except ImportError:  # a baseline tree from before the settings classes were renamed
    from exporter.sampler import SamplerConfig as SamplerSettings  # type: ignore[attr-defined,no-redef]
from healthd.sim.node import SimulatedNode

ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
INTERVAL = 5.0
MAX_AGE = 10.0  # the daemon's: max(2 intervals, interval + 2 call deadlines)
PHASES = (("start, first Prometheus", 0.0), ("steady", 60.0), ("replica joins", 127.0), ("steady, two", 187.0))
PHASES += (("first stops, comes back", 240.0), ("after", 300.0))
END = 360.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """The busy node with attribution, and a factory for the exposition cache as this tree's daemon builds it."""

    def __init__(self, gpus: int, root: Path) -> None:
        scenario = parse_scenario(busy_data(gpus), source=f"busy-{gpus}")
        self.backend = SimulatedBackend(scenario)
        self.node = SimulatedNode(self.backend, root / "node")
        self.node.kubelet.socket_path = root / "kubelet.sock"
        self.sampler = Sampler(self.backend, SamplerSettings(interval_seconds=INTERVAL, call_deadline_seconds=5.0))
        self.kubelet = KubeletPodResources(self.node.kubelet.socket_path, refresh_interval=3600)
        resolver = ProcResolver(self.node.proc_root)
        self.attributor = Attributor(resolver, pod_index=PodLogIndex(self.node.log_root), kubelet=self.kubelet)
        self.node.start()
        self.cycle()
        self.collectors = [
            *default_collectors(),
            ProcessCollector(self.attributor.latest),
            PodCollector(self.attributor.latest),
        ]

    def cycle(self) -> Any:
        snapshot = self.sampler.run_once()
        self.node.sync()
        self.kubelet.refresh()
        self.attributor.update(snapshot)
        return snapshot

    def cache(self, monotonic: Callable[[], float], interval: float | None) -> tuple[ExpositionCache, str]:
        try:
            from exporter.collectors.render import SnapshotRenderer
            from exporter.exposition import PROMETHEUS_FORMATS
        except ImportError:  # the tree before the block-cached render
            from prometheus_client.registry import CollectorRegistry

            registry = CollectorRegistry(auto_describe=False)
            registry.register(SnapshotExporter(self.sampler.latest, self.collectors))
            cache = ExpositionCache(registry, max_age=MAX_AGE, interval=interval, monotonic=monotonic)
            return cache, "registry over SnapshotExporter"
        kwargs: dict[str, Any] = {}
        if "expect" in inspect.signature(ExpositionCache).parameters:
            kwargs["expect"] = PROMETHEUS_FORMATS
        renderer = SnapshotRenderer(self.collectors)
        cache = ExpositionCache(renderer, max_age=MAX_AGE, interval=interval, monotonic=monotonic, **kwargs)
        return cache, "SnapshotRenderer"

    def close(self) -> None:
        self.kubelet.stop()
        self.node.stop()
        self.sampler.stop()


def render_cpu(node: Node, cycles: int) -> dict[str, Any]:
    """CPU of one render per cycle for Prometheus' format (collect, OpenMetrics, gzip), on the rendering thread."""
    cache, path = node.cache(time.monotonic, None)  # no interval: every publish renders what was asked for
    cache.payload(ACCEPT, "gzip")  # Prometheus' format is asked for
    seconds = []
    for _ in range(cycles):
        snapshot = node.cycle()
        started = time.thread_time()
        cache.publish(snapshot)
        seconds.append(time.thread_time() - started)
    body = cache.payload(ACCEPT, "gzip").body
    return {"path": path, "render_seconds": seconds, "gzip_bytes": len(body), "bytes": len(gzip.decompress(body))}


def timeline(node: Node) -> list[dict[str, Any]]:
    """Renders by phase over the scripted scrapers (see the module docstring)."""
    clock = FakeClock()
    renders = {"publish": 0, "request": 0}
    seconds = {"publish": 0.0, "request": 0.0}
    cache, _ = node.cache(clock, INTERVAL)
    collect = _counting(cache, renders)

    def due(t: float, start: float, stop: float = END + 1) -> int:
        return int(start <= t < stop and round((t - start) * 10) % 150 == 0)

    def scrapers(t: float) -> list[str]:  # hosts asking at t: the first Prometheus, its replica, the first again
        return ["10.0.0.1"] * (due(t, 10.3, 240.0) + due(t, 283.3)) + ["10.0.0.2"] * due(t, 127.3)

    per_client = "client" in inspect.signature(cache.payload).parameters  # a tree that tells scrapers apart

    out: list[dict[str, Any]] = []
    marks = [start for _, start in PHASES[1:]] + [END]
    phase = 0
    before = dict(renders), dict(seconds)
    for tick in range(round(END * 10) + 1):
        t = tick / 10
        clock.now = 1000.0 + t
        if marks and t >= marks[0]:
            out.append(_phase(PHASES[phase][0], before, renders, seconds))
            before, phase = (dict(renders), dict(seconds)), phase + 1
            marks.pop(0)
        if tick % 50 == 0:
            snapshot = node.cycle()
            collect("publish", lambda s=snapshot: cache.publish(s), seconds)
        for host in scrapers(t):
            kwargs = {"client": host} if per_client else {}
            collect("request", lambda kw=kwargs: cache.payload(ACCEPT, "gzip", **kw), seconds)
    return out


def _counting(cache: ExpositionCache, renders: dict[str, int]) -> Callable[..., None]:
    """Counts renders by side: wraps the cache's source (a registry's collect, or the renderer's render)."""
    side = ["publish"]
    holder = cache._renderer if hasattr(cache, "_renderer") else cache._registry  # a probe into either tree
    name = "render" if hasattr(holder, "render") else "collect"
    inner = getattr(holder, name)

    def counted(*args: Any) -> Any:
        renders[side[0]] += 1
        return inner(*args)

    setattr(holder, name, counted)

    def collect(which: str, call: Callable[[], object], seconds: dict[str, float]) -> None:
        side[0] = which
        started = time.thread_time()
        call()
        seconds[which] += time.thread_time() - started

    return collect


def _phase(name: str, before: tuple[dict[str, int], dict[str, float]], renders: dict[str, int],
           seconds: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    return {
        "phase": name,
        "renders_at_publish": renders["publish"] - before[0]["publish"],
        "renders_on_request": renders["request"] - before[0]["request"],
        "cpu_publish": seconds["publish"] - before[1]["publish"],
        "cpu_request": seconds["request"] - before[1]["request"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--no-timeline", action="store_true")
    ap.add_argument("--out", type=Path, required=True, help="where the JSON result goes (the daemon logs to stdout)")
    args = ap.parse_args(argv)
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="xpu-bench-render-", dir=shm if shm.is_dir() else None) as tmp:
        node = Node(args.gpus, Path(tmp))
        try:
            result = render_cpu(node, args.cycles)
            result["timeline"] = [] if args.no_timeline else timeline(node)
        finally:
            node.close()
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
