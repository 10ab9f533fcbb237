"""Peers on the same card, one after another at a 1 s interval (a step of the device check): xpu-healthd,
nvitop-exporter and ``nvidia-smi --query-gpu``: scrape (or call) latency, CPU per sample, resident memory.
``--rehearse``: xpu-healthd on the simulated node; the two peers that need a driver are reported skipped.

    python3 -m bench.check_peers --out DIR [--window 6] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, median, percentile, proc_cpu_seconds, proc_status_kib
from bench.daemon_bench import DaemonRun
from bench.daemon_bench import http_get as get
from bench.metrics_bench import PROMETHEUS_ACCEPT

INTERVAL_S = 1.0
SMI_FIELDS = (
    "index,uuid,name,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,"
    "power.draw,power.limit,clocks.sm,clocks.mem,pstate,pcie.link.gen.current,ecc.errors.uncorrected.volatile.total"
)
NO_GPU = "skipped: no GPU (rehearsal)"


def burst(port: int, n: int) -> dict[str, float]:
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    times = [get(port, "/metrics", headers)[2] for _ in range(n)]
    return {"scrape_p50_ms": median(times) * 1e3, "scrape_p99_ms": percentile(times, 0.99) * 1e3}


def measure_process(proc: subprocess.Popen[bytes], port: int, window: float) -> dict[str, float]:
    cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
    time.sleep(window)
    cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
    return {
        "cpu_seconds": cpu1 - cpu0,
        "window_seconds": t1 - t0,
        "rss_mib": proc_status_kib(proc.pid, "VmRSS") / 1024,
        **burst(port, 20),
    }


def wait_http(port: int, path: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before answering {path}")
        try:
            if get(port, path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no answer on {path} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run_with_rusage(argv: list[str]) -> tuple[int, float, float, int]:
    """(exit status, wall s, CPU s, max RSS KiB) of one child, from its own rusage."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def ours(root: Path, window: float, rehearse: bool) -> dict[str, Any]:
    run = DaemonRun(0, 0, root, interval=INTERVAL_S, real=not rehearse, scenario="h200x1" if rehearse else None)
    run.start()
    try:
        run.wait_ready(60)
        run.discover_gpus()
        assert run.proc is not None
        cycles0 = run.cycles()
        m: dict[str, Any] = measure_process(run.proc, run.port, window)
        cycles = run.cycles() - cycles0
        m["cpu_per_sample_ms"] = m["cpu_seconds"] / max(cycles, 1) * 1e3
        m["samples"] = cycles
        return m
    finally:
        run.stop()


def nvitop_exporter(out: Path, window: float) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "nvitop_exporter", "--hostname", "localhost", "--bind-address", "127.0.0.1"]
    with (out / "nvitop-exporter.log").open("wb") as log:
        proc = subprocess.Popen([*argv, "--port", str(port), "--interval", str(INTERVAL_S)], stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_http(port, "/metrics", proc, 30)
            m: dict[str, Any] = measure_process(proc, port, window)
            m["samples"] = m["window_seconds"] / INTERVAL_S  # its loop runs one update per interval
            m["cpu_per_sample_ms"] = m["cpu_seconds"] / m["samples"] * 1e3
            return m
        finally:
            stop_process(proc)


def measure_nvidia_smi(n: int) -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi not found")
    calls = [run_with_rusage(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"]) for _ in range(n)]
    return {
        "calls": len(calls),
        "failed": sum(1 for rc, *_ in calls if rc != 0),
        "scrape_p50_ms": median([c[1] for c in calls]) * 1e3,
        "scrape_p99_ms": percentile([c[1] for c in calls], 0.99) * 1e3,
        "cpu_per_sample_ms": sum(c[2] for c in calls) / len(calls) * 1e3,
        "rss_mib": max(c[3] for c in calls) / 1024,
        "fields": SMI_FIELDS.count(",") + 1,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=float, default=6.0, help="seconds each exporter is measured")
    ap.add_argument("--rehearse", action="store_true")
    args = ap.parse_args(argv)
    peers: dict[str, Any] = {}
    path = args.out / "result.json"
    runs = {
        "xpu-healthd": lambda: ours(args.out / "xpu", args.window, args.rehearse),
        "nvitop-exporter": lambda: nvitop_exporter(args.out, args.window),
        "nvidia-smi --query-gpu": lambda: measure_nvidia_smi(20),
    }
    for name, measure in runs.items():
        if args.rehearse and name != "xpu-healthd":
            peers[name] = {"skipped": NO_GPU}
            continue
        try:
            peers[name] = measure()
        except Exception as exc:  # one peer that cannot run is evidence, not the end of the step
            peers[name] = {"error": f"{type(exc).__name__}: {exc}"}
        path.write_text(json.dumps(peers, indent=1) + "\n")
    path.write_text(json.dumps(peers, indent=1) + "\n")
    print(json.dumps(peers))
    return 0 if "error" not in peers["xpu-healthd"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
