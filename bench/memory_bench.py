"""Where the daemon's resident memory goes, on a simulated node: its RSS split by kind of mapping (libraries, the
main heap, malloc's thread arenas and Python's object arenas, thread stacks) from /proc/<pid>/smaps, then, in a
second daemon started with tracemalloc, the Python allocations still alive by the module that made them.

    python3 bench/memory_bench.py [--node h200x8-busy | --scenario FILE] [--seconds 60]

Both daemons run at the default 5 s interval with a scrape every 15 s (Prometheus' headers). tracemalloc slows the
second one and adds its own memory, so its figures are for the split, not the total. Numbers are printed; nothing
is asserted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, proc_status_kib
from bench.daemon_bench import http_get
from bench.metrics_bench import PROMETHEUS_HEADERS

REPO = Path(__file__).resolve().parent.parent
MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
ARENA = 64 << 20  # glibc's thread arenas are reserved 64 MiB at a time, aligned to 64 MiB
TRACER = """
import json, os, signal, sys, threading, tracemalloc
out, seconds = sys.argv[1], float(sys.argv[2])
tracemalloc.start(1)
import healthd.main
def snap():
    stats = tracemalloc.take_snapshot().statistics("filename")
    rows = [(s.traceback[0].filename, s.size, s.count) for s in stats]
    json.dump(rows, open(out, "w"))
    os.kill(os.getpid(), signal.SIGTERM)
threading.Timer(seconds, snap).start()
sys.exit(healthd.main.main(sys.argv[3:]))
"""


def smaps_split(pid: int) -> dict[str, int]:
    """KiB resident by kind of mapping."""
    out: collections.Counter[str] = collections.Counter()
    kind = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = MAP.match(line)
        if m:
            lo, hi, path = int(m.group(1), 16), int(m.group(2), 16), m.group(4)
            if path.startswith("/"):
                kind = "libraries and other files"
            elif path == "[heap]":
                kind = "main malloc heap"
            elif path.startswith("["):
                kind = "stacks and kernel pages" if path == "[stack]" else "kernel pages"
            elif lo % ARENA == 0 and hi - lo <= ARENA:
                kind = "malloc thread arenas"
            elif hi - lo in (8 << 20, (8 << 20) + 4096):
                kind = "thread stacks"
            else:
                kind = "Python object arenas and large buffers"
        elif line.startswith("Rss:"):
            out[kind] += int(line.split()[1])
    return dict(out)


def area(filename: str) -> str:
    """A module path -> the part of the daemon it belongs to."""
    path = filename.replace(str(REPO) + "/", "")
    if path.startswith("<frozen importlib"):
        return "module code and import (bytecode, constants)"
    for prefix in ("exporter/collectors/render.py", "exporter/encoding.py", "exporter/exposition.py"):
        if path.startswith(prefix):
            return "render cache and bodies (" + prefix.split("/")[-1] + ")"
    m = re.match(r"(exporter|healthd)/([a-z_]+)", path)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    return "standard library and dependencies"


def scrape_for(port: int, seconds: float, pid: int) -> list[float]:
    """Scrape every 15 s for ``seconds``; returns the daemon's RSS (KiB) read every 5 s over the second half (it
    moves by a few MiB with the render cycle, so one reading at the end is one point of that)."""
    started = time.monotonic()
    end, next_scrape = started + seconds, started + 15.0
    rss: list[float] = []
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(5.0, left))
        if time.monotonic() >= next_scrape:
            next_scrape += 15.0
            with contextlib.suppress(OSError):  # one missed scrape changes nothing here
                http_get(port, "/metrics", PROMETHEUS_HEADERS)
        if time.monotonic() - started >= seconds / 2:
            rss.append(proc_status_kib(pid, "VmRSS"))
    return rss


def daemon_args(scenario: str, root: Path, port: int) -> list[str]:
    return ["--simulate", scenario, "--metrics-listen", f"127.0.0.1:{port}", "--grpc-listen",
            f"unix:{root}/h.sock", "--state-dir", str(root / "state")]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", default="h200x8-busy", help="a built-in scenario")
    ap.add_argument("--scenario", type=Path, help="a scenario file instead (bench/scenarios.py writes them)")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    scenario = str(args.scenario) if args.scenario else args.node
    with tempfile.TemporaryDirectory(prefix="xpu-bench-memory-") as tmp:
        root = Path(tmp)
        (root / "plain").mkdir()
        (root / "traced").mkdir()
        plain_port, traced_port = free_port(), free_port()
        plain = subprocess.Popen([sys.executable, "-m", "healthd", *daemon_args(scenario, root / "plain", plain_port)],
                                 cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        out = root / "traced.json"
        traced_args = daemon_args(scenario, root / "traced", traced_port)
        traced = subprocess.Popen([sys.executable, "-c", TRACER, str(out), str(args.seconds), *traced_args],
                                  cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            second_half = scrape_for(plain_port, args.seconds, plain.pid)
            split = smaps_split(plain.pid)
            rss, threads = proc_status_kib(plain.pid, "VmRSS"), proc_status_kib(plain.pid, "Threads")
            traced.wait(60)
        finally:
            for p in (plain, traced):
                p.terminate()
                p.wait(30)
        rows = json.loads(out.read_text())
    print(
        f"== memory of the daemon on {scenario} after {args.seconds:.0f} s: RSS {rss / 1024:.1f} MiB, {threads} threads"
    )
    if second_half:
        mean, top = sum(second_half) / len(second_half) / 1024, max(second_half) / 1024
        print(
            f"  RSS over the second half, every 5 s: mean {mean:.1f} MiB, max {top:.1f} MiB ({len(second_half)} reads)"
        )
    for kind, kib in sorted(split.items(), key=lambda kv: -kv[1]):
        print(f"  {kib / 1024:8.1f} MiB  {kind}")
    by_area: collections.Counter[str] = collections.Counter()
    for filename, size, _count in rows:
        by_area[area(filename)] += size
    print(f"  Python allocations alive (tracemalloc, a second daemon): {sum(by_area.values()) / 2**20:.1f} MiB")
    for name, size in by_area.most_common(16):
        print(f"  {size / 2**20:8.2f} MiB  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
