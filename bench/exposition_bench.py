"""/metrics of this tree against a baseline tree, side by side in one run: every scrape's latency (a new scraper's
first ones included), render CPU per cycle, renders per minute, and the daemon's CPU share; ratios this/baseline.

The baseline is another checkout (``--baseline DIR``) or a commit (``--baseline-ref``, default the tree before the
block-cached render), checked out with ``git worktree add`` for the run and removed after. Both run on the same
interpreter and packages. Per node (``h200x8``, ``h200x8-busy``, 64 busy cards):

1. In process (bench/exposition_render.py, per tree, the trees in turn twice): CPU of one render per cycle for
   Prometheus' format (collect, OpenMetrics, gzip), and renders at publish and on a request's thread over a
   scripted six minutes (a new Prometheus, its HA replica joining, the first restarting), on a fake clock.
2. Two real daemons (``python3 -m healthd --simulate``, no config file: 5 s interval, attribution on), one per
   tree, started together and scraped by the same scrapers: each scrape goes to one daemon and half a period
   (7.5 s) later to the other, which goes first swapped every time, so neither daemon's scrape meets the other's
   render. Kept-alive connections from the scraper's own loopback address (Prometheus servers have their own
   hosts), with Prometheus' headers:

   - scraper A from the moment the daemon is healthy (its first 3 scrapes: a new Prometheus, fresh daemon);
   - a CPU window while A alone scrapes every 15 s, its rhythm learned: CPU share (/proc/<pid>/stat);
   - scraper B joins 12.5 s after one of A's scrapes (its first 3: an HA replica joining);
   - A stops for 37.5 s and comes back on a new connection (its first 3: a restarted Prometheus);
   - then 100 back-to-back scrapes to each.

   "first" is the 9 first scrapes, "every" all scrapes in the Prometheus rhythm (first ones included).

Nothing here asserts a time; numbers and ratios are printed. On a shared 2-core machine the ratios are what
counts: both trees meet the same load at the same moments.

    python3 bench/exposition_bench.py [--node h200x8-busy ...] [--baseline DIR | --baseline-ref REF] [--quick]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, proc_cpu_seconds
from bench.daemon_bench import REPO, DaemonRun
from bench.metrics_bench import PROMETHEUS_HEADERS
from bench.scrape_bench import NODES, Node

BASELINE_REF = "16e7291"  # the last tree whose /metrics went through prometheus_client families on every render
EVERY = 15.0
SETTLE_WAIT = 12.0  # after /healthz: the first kubelet refresh (about 5.5 s) and the cycle that attributes pods
HOSTS = {"A": "127.0.0.2", "B": "127.0.0.3"}
BURST = 100
HALF = EVERY / 2  # each scrape reaches the second daemon half a period after the first: never both at once
WINDOW_OPENS = 56.25  # between two scrapes of either daemon: the window holds whole periods of both


@dataclass
class Scraper:
    """One Prometheus: a kept-alive connection per daemon, from its own loopback address."""

    host: str
    conns: dict[str, http.client.HTTPConnection] = field(default_factory=dict)

    def get(self, name: str, port: int) -> tuple[float, bytes]:
        conn = self.conns.get(name)
        if conn is None:
            conn = self.conns[name] = http.client.HTTPConnection(
                "127.0.0.1", port, timeout=60, source_address=(self.host, 0)
            )
        started = time.perf_counter()
        conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
        resp = conn.getresponse()
        body = resp.read()
        seconds = time.perf_counter() - started
        if resp.status != 200:
            raise RuntimeError(f"{name}: /metrics answered {resp.status}")
        return seconds, body

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


@dataclass
class Measured:
    first: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    cpu_share: float = float("nan")
    attributed: bool = False
    slowest: tuple[float, str] = (0.0, "")  # the slowest scrape in the rhythm, and which one it was


def _worktree(ref: str, parent: Path) -> Path:
    path = parent / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), ref], check=True,
                   capture_output=True)  # fmt: skip
    return path


@contextmanager
def baseline_tree(directory: Path | None, ref: str, parent: Path) -> Iterator[Path]:
    if directory is not None:
        yield directory
        return
    path = _worktree(ref, parent)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def in_process(tree: Path, gpus: int, cycles: int, out: Path, timeline: bool = True) -> dict[str, Any]:
    """bench/exposition_render.py against ``tree`` (its exporter and healthd), in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = Path(__file__).resolve().parent / "exposition_render.py"
    cmd = [sys.executable, str(script), "--gpus", str(gpus), "--cycles", str(cycles), "--out", str(out)]
    cmd += [] if timeline else ["--no-timeline"]
    subprocess.run(cmd, env=env, check=True, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def renders_of(trees: dict[str, Path], gpus: int, cycles: int, root: Path) -> dict[str, dict[str, Any]]:
    """Each tree's in-process figures, the trees in turn twice (the second time render CPU only), so a change in
    the machine's load meets both."""
    out = {name: in_process(tree, gpus, cycles, root / f"{name}.json") for name, tree in trees.items()}
    for name, tree in reversed(trees.items()):
        again = in_process(tree, gpus, cycles, root / f"{name}-again.json", timeline=False)
        out[name]["render_seconds"] += again["render_seconds"]
    return out


def plan(window: float) -> list[tuple[float, str]]:
    """(seconds after the start, what happens), in order. A scrape is "A-first", "A-steady", "B-first", ...;
    "open"/"close" bound the CPU window; "reconnect" is A coming back on a new connection."""
    events = [(WINDOW_OPENS, "open"), (WINDOW_OPENS + window, "close")]  # whole periods of both daemons' scrapes
    stop = 52.5 + window + 52.5  # A's last scrape before its restart
    events += [(n * EVERY, "A-first" if n < 3 else "A-steady") for n in range(round(stop / EVERY) + 1)]
    join = 52.5 + window + 20.0  # B: 5 s after one of A's scrapes (to the other daemon)
    events += [(join + n * EVERY, "B-first" if n < 3 else "B-steady") for n in range(11)]
    back = stop + 52.5  # A silent for 37.5 s past its due scrape
    events += [(back - 0.001, "reconnect")]
    events += [(back + n * EVERY, "A-first" if n < 3 else "A-steady") for n in range(5)]
    return sorted(events)


def side_by_side(node: Node, trees: dict[str, Path], root: Path, window: float) -> dict[str, Measured]:
    root.mkdir(parents=True, exist_ok=True)
    runs = {
        name: DaemonRun(node.gpus, 0, root / name, scenario=node.scenario(root), repo=tree)
        for name, tree in trees.items()
    }
    measured = {name: Measured() for name in runs}
    scrapers = {key: Scraper(host) for key, host in HOSTS.items()}
    names = list(runs)
    timeline: list[tuple[float, str, str]] = []
    for turn, (offset, what) in enumerate(plan(window)):  # each scrape to one daemon, then the other, in turn
        if what in ("open", "close", "reconnect"):
            timeline.append((offset, what, ""))
            continue
        first, second = names if turn % 2 == 0 else names[::-1]
        timeline += [(offset, what, first), (offset + HALF, what, second)]
    try:
        for run in runs.values():
            run.start()
        for run in runs.values():
            run.wait_ready()
        time.sleep(SETTLE_WAIT)
        t0 = time.monotonic()
        cpu0: dict[str, float] = {}
        opened = t0
        for offset, what, name in sorted(timeline):
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            if what == "open":
                cpu0, opened = {n: proc_cpu_seconds(_pid(r)) for n, r in runs.items()}, time.monotonic()
            elif what == "close":
                wall = time.monotonic() - opened
                for n, r in runs.items():
                    measured[n].cpu_share = (proc_cpu_seconds(_pid(r)) - cpu0[n]) / wall
            elif what == "reconnect":
                scrapers["A"].close()
            else:
                key, kind = what.split("-")
                _scrape(scrapers[key], runs[name], measured[name], kind, node, f"{what} at +{offset:.1f} s")
        for turn in range(2 * BURST):
            name = names[turn % 2]
            _scrape(scrapers["A"], runs[name], measured[name], "burst", node)
        return measured
    finally:
        for scraper in scrapers.values():
            scraper.close()
        for run in runs.values():
            run.stop()


def _scrape(scraper: Scraper, run: DaemonRun, measured: Measured, kind: str, node: Node, label: str = "") -> None:
    seconds, body = scraper.get(str(run.root), run.port)
    getattr(measured, kind).append(seconds)
    if kind != "burst" and seconds > measured.slowest[0]:
        measured.slowest = (seconds, label)
    measured.attributed |= b"\nxpu_pod_gpu_processes{" in gzip.decompress(body) or not node.pods


def _pid(run: DaemonRun) -> int:
    assert run.proc is not None
    return run.proc.pid


def _ms(values: Sequence[float], q: float | None = None) -> float:
    if not values:
        return float("nan")
    if q is None:
        return max(values) * 1e3
    return (statistics.median(values) if q == 0.5 else percentile(values, q)) * 1e3


def report(node: Node, renders: dict[str, dict[str, Any]], measured: dict[str, Measured]) -> list[str]:
    lines = [f"== {node.name}: {node.gpus} GPUs, {node.processes} processes, {node.pods} pods"]

    def row(what: str, unit: str, base: float, this: float) -> None:
        ratio = this / base if base else float("nan")
        lines.append(f"  {what:<52} {base:10.3f} {this:10.3f} {unit:<4} {ratio:8.3f}")

    lines.append(f"  {'':<52} {'baseline':>10} {'this':>10} {'':<4} {'ratio':>8}")
    b, t = measured["baseline"], measured["this"]
    for label, attr in (("first scrapes of a new scraper (9)", "first"), ("steady scrapes, every 15 s", "steady")):
        row(f"{label}: p50", "ms", _ms(getattr(b, attr), 0.5), _ms(getattr(t, attr), 0.5))
        row("  max", "ms", _ms(getattr(b, attr)), _ms(getattr(t, attr)))
    every_b, every_t = b.first + b.steady, t.first + t.steady
    row(f"every scrape in the rhythm ({len(every_t)}): p99", "ms", _ms(every_b, 0.99), _ms(every_t, 0.99))
    row("  max", "ms", _ms(every_b), _ms(every_t))
    row(f"back-to-back ({BURST}): p50", "ms", _ms(b.burst, 0.5), _ms(t.burst, 0.5))
    row("  p99", "ms", _ms(b.burst, 0.99), _ms(t.burst, 0.99))
    row("  max", "ms", _ms(b.burst), _ms(t.burst))
    row("daemon CPU share, 5 s sampling, a scrape every 15 s", "%", b.cpu_share * 100, t.cpu_share * 100)
    rb, rt = renders["baseline"], renders["this"]
    sb, st = list(rb["render_seconds"]), list(rt["render_seconds"])
    row("render CPU per cycle (OpenMetrics + gzip): p50", "ms", _ms(sb, 0.5), _ms(st, 0.5))
    row("  max", "ms", _ms(sb), _ms(st))
    for pb, pt in zip(rb["timeline"], rt["timeline"], strict=True):
        name = pb["phase"]
        row(f"renders, {name}: at publish", "", pb["renders_at_publish"], pt["renders_at_publish"])
        row("  on a request's thread (a scrape waited)", "", pb["renders_on_request"], pt["renders_on_request"])
        row("  CPU, all renders of the phase", "ms", 1e3 * (pb["cpu_publish"] + pb["cpu_request"]),
            1e3 * (pt["cpu_publish"] + pt["cpu_request"]))  # fmt: skip
    for name, m in measured.items():
        lines.append(f"  slowest scrape in the rhythm, {name}: {m.slowest[0] * 1e3:.2f} ms ({m.slowest[1]})")
    if not (b.attributed and t.attributed):
        lines.append("  (warning: a daemon served no pod series: attribution had not run yet)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", choices=sorted(NODES), action="append", help="default: h200x8, h200x8-busy, 64 busy")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with (default: --baseline-ref)")
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--window", type=float, default=120.0, help="seconds of the CPU window")
    ap.add_argument("--quick", action="store_true", help="a 60 s CPU window, 6 render cycles")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args(argv)
    window, cycles = (60.0, 6) if args.quick else (args.window, 12)
    nodes = [NODES[n] for n in args.node or ("h200x8", "h200x8-busy", "h200x64-busy")]
    with tempfile.TemporaryDirectory(prefix="xpu-bench-exposition-", dir=args.work_dir) as tmp:
        root = Path(tmp)
        with baseline_tree(args.baseline, args.baseline_ref, root) as base:
            trees = {"baseline": base.resolve(), "this": REPO}
            for node in nodes:
                renders = {
                    name: in_process(tree, node.gpus, cycles, root / f"{name}.json") for name, tree in trees.items()
                }
                measured = side_by_side(node, trees, root / node.name, window)
                print("\n".join(report(node, renders, measured)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
