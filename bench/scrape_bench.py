"""The headline /metrics figures, measured on the real daemon: scrape latency, daemon CPU, and what a scrape holds.

Each point runs ``python3 -m healthd --simulate <node>`` alone (no config file: the default 5 s interval, process and
pod attribution on, the simulated kubelet), waits until it is healthy and has attributed its pods, then:

1. a window (60 s; ``--quick`` 30 s) with one scrape every 15 s, as Prometheus would: the daemon's CPU share of
   one core (utime + stime of all its threads over the wall time) and its CPU per sampling cycle;
2. 200 back-to-back scrapes over one kept-alive HTTP/1.1 connection with Prometheus' headers (OpenMetrics first,
   gzip): p50, p99 and the slowest; then 50 more as ``curl`` asks (text format, no gzip);
3. the text body split by what each series describes: a process (``pid`` label), a pod (``pod`` label, no
   ``pid``), a card or MIG instance (``uuid`` or ``gpu``), or the node: series and bytes of each, per card, per
   process and per pod. HELP/TYPE lines count towards the family's first series' kind.

Points: ``h200x8`` (the default node: 8 processes in 8 pods), ``h200x8-busy`` (400 processes in 100 pods), and 64
GPUs with no processes and busy (3,200 processes in 800 pods; ``bench.scenarios.busy_data``). ``--quick`` measures
the two busy nodes only.

    python3 bench/scrape_bench.py [--node h200x8-busy] [--scrapes 200] [--window 30]
    python3 -m bench --only scrape
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchArgs, Row, median, percentile
from bench.daemon_bench import READY_TIMEOUT_SECONDS, SCRAPE_EVERY_SECONDS, DaemonRun
from bench.metrics_bench import scrape_latencies
from bench.scenarios import BUSY_SCENARIO_FILE, scaled_data, to_toml, write_busy_scenario

NAME = "scrape"
SCRAPES = 200
CURL_SCRAPES = 50
ATTRIBUTED = re.compile(r"^xpu_pod_gpu_processes\{", re.MULTILINE)
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? ")
LABEL_KEY = re.compile(r'(?:\{|",)([a-zA-Z_][a-zA-Z0-9_]*)="')


@dataclass(frozen=True, slots=True)
class Node:
    """A node to run: its name in the table, GPU, process and pod counts, and how to make its scenario."""

    name: str
    gpus: int
    processes: int
    pods: int
    busy: bool

    def scenario(self, root: Path) -> str:
        """What ``--simulate`` gets: the built-in file when this tree has it, else a file written here."""
        if self.name == "h200x8":
            return "h200x8"
        path = root / f"{self.name}.toml"
        if self.busy:
            if self.gpus == 8 and BUSY_SCENARIO_FILE.is_file():
                return str(BUSY_SCENARIO_FILE)
            return str(write_busy_scenario(path, self.gpus))
        path.write_text(to_toml(scaled_data(self.gpus, 0)))
        return str(path)


NODES = {
    "h200x8": Node("h200x8", 8, 8, 8, busy=False),
    "h200x8-busy": Node("h200x8-busy", 8, 400, 100, busy=True),
    "h200x64": Node("h200x64", 64, 0, 0, busy=False),
    "h200x64-busy": Node("h200x64-busy", 64, 3200, 800, busy=True),
}
QUICK_NODES = ("h200x8-busy", "h200x64-busy")


@dataclass
class Composition:
    """Series and bytes of one text body by what they describe."""

    series: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    total_bytes: int = 0


def kind_of(labels: str) -> str:
    keys = set(LABEL_KEY.findall(labels)) if labels else set()
    if "pid" in keys:
        return "process"
    if "pod" in keys:
        return "pod"
    if keys & {"uuid", "gpu"}:
        return "card"
    return "node"


def composition(text: str) -> Composition:
    """Split a text-format (0.0.4) body by kind; comment lines go with the next sample's kind."""
    out = Composition(total_bytes=len(text.encode()))
    pending = 0
    for line in text.splitlines(keepends=True):
        size = len(line.encode())
        if line.startswith("#"):
            pending += size
            continue
        m = SAMPLE_LINE.match(line)
        if m is None:
            continue
        kind = kind_of(m.group(2) or "")
        out.series[kind] = out.series.get(kind, 0) + 1
        out.bytes[kind] = out.bytes.get(kind, 0) + size + pending
        pending = 0
    return out


@dataclass
class Result:
    node: Node
    cpu_share: float
    cpu_per_cycle: float
    window: float
    cycles: float
    prometheus: list[float]
    curl: list[float]
    gzip_bytes: int
    openmetrics_bytes: int
    text: Composition


def wait_until_attributed(run: DaemonRun, node: Node) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    run.wait_ready(READY_TIMEOUT_SECONDS)
    while node.pods and not ATTRIBUTED.search(run.metrics_text()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"daemon ({node.name}) has no pod series:\n{run.log_tail()}")
        time.sleep(0.5)


def measure(node: Node, window: float, scrapes: int, work_dir: Path) -> Result:
    with tempfile.TemporaryDirectory(prefix="xpu-bench-scrape-", dir=work_dir) as tmp:
        root = Path(tmp)
        run = DaemonRun(node.gpus, 0, root / "daemon", scenario=node.scenario(root))
        try:
            run.start()
            wait_until_attributed(run, node)
            run.begin()
            end = run.t0 + window
            next_scrape = run.t0
            while (now := time.monotonic()) < end:
                if now >= next_scrape:
                    run.scrape()
                    next_scrape += SCRAPE_EVERY_SECONDS
                time.sleep(max(0.0, min(next_scrape, end) - time.monotonic()))
            run.end_window()
            prom_times, gz = scrape_latencies(run.port, scrapes)
            curl_times, text = scrape_latencies(run.port, CURL_SCRAPES, {})
        finally:
            run.stop()
    cpu, wall, cycles = run.cpu1 - run.cpu0, run.t1 - run.t0, run.cycles1 - run.cycles0
    return Result(
        node=node,
        cpu_share=cpu / wall,
        cpu_per_cycle=cpu / max(cycles, 1.0),
        window=wall,
        cycles=cycles,
        prometheus=prom_times,
        curl=curl_times,
        gzip_bytes=len(gz),
        openmetrics_bytes=len(gzip.decompress(gz)),
        text=composition(text.decode()),
    )


def rows(r: Result) -> list[Row]:
    n = r.node
    ms = 1e3

    def row(metric: str, unit: str, value: float, note: str = "") -> Row:
        return Row(metric, unit, value, n.gpus, n.processes, n.pods, note)

    c = r.text
    out = [
        row("scrape p50, Prometheus headers", "ms", median(r.prometheus) * ms, f"{len(r.prometheus)} kept-alive"),
        row("scrape p99, Prometheus headers", "ms", percentile(r.prometheus, 0.99) * ms),
        row("  slowest", "ms", max(r.prometheus) * ms),
        row("scrape p50, text, no gzip", "ms", median(r.curl) * ms, f"{len(r.curl)} kept-alive"),
        row("scrape p99, text, no gzip", "ms", percentile(r.curl, 0.99) * ms),
        row("daemon CPU share of one core", "%", r.cpu_share * 100, f"5 s interval, {r.window:.0f} s window"),
        row("  CPU per sampling cycle", "ms", r.cpu_per_cycle * ms, f"{r.cycles:.0f} cycles, scrapes included"),
        row("body: OpenMetrics", "KiB", r.openmetrics_bytes / 1024),
        row("body: OpenMetrics gzip", "KiB", r.gzip_bytes / 1024),
        row("body: text", "KiB", c.total_bytes / 1024),
        row("series", "", float(sum(c.series.values()))),
    ]
    for kind, count in (("card", n.gpus), ("process", n.processes), ("pod", n.pods), ("node", 1)):
        if not count or not c.series.get(kind):
            continue
        out += [
            row(f"  series per {kind}", "", c.series[kind] / count),
            row(f"  bytes per {kind} (text)", "B", c.bytes[kind] / count),
        ]
    return out


def run(args: BenchArgs) -> list[Row]:
    names = QUICK_NODES if args.quick else tuple(NODES)
    window = 30.0 if args.quick else 60.0
    out: list[Row] = []
    for name in names:
        out += rows(measure(NODES[name], window, SCRAPES, args.work_dir))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", choices=sorted(NODES), action="append", help="default: h200x8-busy")
    ap.add_argument("--scrapes", type=int, default=SCRAPES)
    ap.add_argument("--window", type=float, default=30.0, help="seconds of the CPU window")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args(argv)
    for name in args.node or ["h200x8-busy"]:
        for r in rows(measure(NODES[name], args.window, args.scrapes, args.work_dir)):
            print(f"{name:<13} {r.metric:<45} {r.value:10.3f} {r.unit:<4} {r.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
