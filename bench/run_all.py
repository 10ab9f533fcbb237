"""Run every bench module and print one table: each measured number as the node grows (1, 8, 16, 64 GPUs).

    python3 -m bench [--quick] [--only NAME ...] [--json PATH]
    python3 bench/run_all.py --quick

Bench modules are listed in MODULES. Each exposes ``NAME: str`` and ``run(args: BenchArgs) -> list[Row]``
(bench/common.py). A listed module missing from the tree is reported as absent; one that raises SkipBench is
reported with its reason; one that fails is reported and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.venv import run_in_the_venv

    run_in_the_venv()

import structlog

from bench.common import BenchArgs, Row, SkipBench

# (module, what it measures)
MODULES: tuple[tuple[str, str], ...] = (
    ("bench.sampler_bench", "sampler CPU per GPU per cycle"),
    ("bench.metrics_bench", "/metrics latency, series, body size"),
    ("bench.daemon_bench", "daemon process: CPU share, RSS, /metrics"),
    ("bench.nvml_overhead", "real NVML: backend and sampler vs the raw calls"),
    ("bench.fault_latency_bench", "XID -> WatchFaults subscriber and -> hook latency"),
    ("bench.partition_bench", "partition create/delete latency over gRPC"),
    ("bench.attribution_bench", "/metrics with and without process and pod attribution"),
    ("bench.profiling_bench", "profiling (GPM) read per card and cycle, its series per scrape"),
    ("bench.deviceplugin_bench", "device plugin: Allocate, health flip latency, plugin memory"),
    ("bench.dra_bench", "DRA driver: prepare latency per claim shape, fault -> taint -> untaint"),
    ("bench.scrape_bench", "the daemon's /metrics: scrape p50/p99, CPU, series per card/process/pod"),
    ("bench.http_server_bench", "the metrics port's server vs thread-per-connection, and 600 idle connections"),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    module: str
    name: str
    what: str
    rows: tuple[Row, ...] = ()
    status: str = "ok"  # ok | absent | skipped | failed
    detail: str = ""
    seconds: float = 0.0


def import_bench(module: str) -> ModuleType | None:
    """The module, or None when it is not in this tree (a missing dependency inside it is an error)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def run_module(module: str, what: str, args: BenchArgs) -> Outcome:
    short = module.rsplit(".", 1)[-1].removesuffix("_bench")
    started = time.monotonic()
    try:
        mod = import_bench(module)
        if mod is None:
            return Outcome(module, short, what, status="absent", detail="not in this tree")
        name = str(getattr(mod, "NAME", short))
        run: Callable[[BenchArgs], Sequence[Row]] = mod.run
        rows = tuple(run(args))
        return Outcome(module, name, what, rows, seconds=time.monotonic() - started)
    except SkipBench as exc:
        return Outcome(module, short, what, status="skipped", detail=str(exc), seconds=time.monotonic() - started)
    except Exception as exc:
        traceback.print_exc()
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return Outcome(module, short, what, status="failed", detail=detail, seconds=time.monotonic() - started)


def fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    a = abs(value)
    if a >= 100 or (value == int(value) and a >= 10):
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _per_gpu(row: Row, count: int | None) -> str:
    if count is None:
        return "-"
    if row.gpus:
        return str(count // row.gpus) + "/gpu"
    return str(count)


def format_table(outcomes: Sequence[Outcome]) -> str:
    """One line per (metric, processes per GPU, pods per GPU), one column per GPU count."""
    gpu_columns = sorted({r.gpus for o in outcomes for r in o.rows if r.gpus is not None})
    has_none = any(r.gpus is None for o in outcomes for r in o.rows)
    columns: list[int | None] = [*gpu_columns, *([None] if has_none else [])]
    metric_width = max([len(r.metric) for o in outcomes for r in o.rows] + [30])
    header = f"{'metric':<{metric_width}} {'procs':>8} {'pods':>7} |" + "".join(
        f"{(f'{c} GPU' + ('s' if c != 1 else '')) if c is not None else 'node':>10}" for c in columns
    )
    out = [header + f"  {'unit':<4} note", "-" * (len(header) + 30)]
    for o in outcomes:
        out.append(f"[{o.name}] {o.what}" + (f": {o.status.upper()} - {o.detail}" if o.status != "ok" else ""))
        lines: dict[tuple[str, str, str, str], dict[int | None, Row]] = {}
        for r in o.rows:
            key = (r.metric, _per_gpu(r, r.processes), _per_gpu(r, r.pods), r.unit)
            lines.setdefault(key, {})[r.gpus] = r
        for (metric, procs, pods, unit), by_gpu in lines.items():
            cells = "".join(f"{fmt(by_gpu[c].value) if c in by_gpu else '':>10}" for c in columns)
            note = next((r.note for r in by_gpu.values() if r.note), "")
            out.append(f"{metric:<{metric_width}} {procs:>8} {pods:>7} |{cells}  {unit:<4} {note}".rstrip())
    return "\n".join(out)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    python = platform.python_version()
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs{load}, Linux {platform.release()}, Python {python}"


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def build_args(ns: argparse.Namespace) -> BenchArgs:
    base = (
        BenchArgs(
            quick=True,
            gpu_counts=(1, 8, 16, 64),
            processes_per_gpu=(0, 50),
            pods_per_gpu=(0, 4),
            daemon_seconds=30.0,
            daemon_gpu_counts=(1, 8, 64),
            scrapes=100,
            cycles=40,
        )
        if ns.quick
        else BenchArgs()
    )
    overrides = {
        "gpu_counts": ns.gpus,
        "processes_per_gpu": ns.processes,
        "daemon_seconds": ns.daemon_seconds,
        "daemon_gpu_counts": ns.daemon_gpus,
        "work_dir": ns.work_dir,
    }
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer points and shorter runs (about 3 minutes)")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only these modules (e.g. sampler)")
    ap.add_argument("--gpus", type=parse_counts, metavar="N,N", help="GPU counts (default 1,8,16,64)")
    ap.add_argument("--processes", type=parse_counts, metavar="N,N", help="processes per GPU (default 0,10,50)")
    ap.add_argument("--daemon-gpus", type=parse_counts, metavar="N,N", help="daemon runs' GPU counts (default 1,8,64)")
    ap.add_argument("--daemon-seconds", type=float, metavar="S", help="daemon measuring window (default 60)")
    ap.add_argument("--work-dir", type=Path, metavar="DIR", help="where the daemon runs keep their files")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write every row as JSON")
    ap.add_argument("--list", action="store_true", help="list the bench modules and exit")
    ns = ap.parse_args(argv)
    if ns.list:
        width = max(len(what) for _, what in MODULES)
        for module, what in MODULES:
            present = "present" if import_bench(module) is not None else "absent"
            print(f"{module:<28} {what:<{width}} {present}")
        return 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    args = build_args(ns)
    host = machine()  # load average before the suite adds its own
    started = time.time()
    outcomes = []
    for module, what in MODULES:
        short = module.rsplit(".", 1)[-1].removesuffix("_bench")
        if ns.only and short not in ns.only:
            continue
        print(f"running {short} ...", file=sys.stderr, flush=True)
        outcome = run_module(module, what, args)
        print(f"  {outcome.status} in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
        outcomes.append(outcome)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    took = time.time() - started
    print(f"xpu-runtime-kit benchmarks, {when}, {host}")
    print(f"simulated H200 nodes (bench/scenarios.py); {'--quick, ' if args.quick else ''}took {took:.0f} s")
    print("procs/pods: per GPU on the node; columns: GPUs on the node")
    print(format_table(outcomes))
    if ns.json:
        ns.json.write_text(
            json.dumps(
                {
                    "when": when,
                    "machine": host,
                    "args": {k: str(v) for k, v in dataclasses.asdict(args).items()},
                    "outcomes": [dataclasses.asdict(o) for o in outcomes],
                },
                indent=1,
            )
        )
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
