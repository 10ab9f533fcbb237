"""Real-GPU validation, the Python half of bench/device_check.sh: one run of a few minutes on an NVIDIA machine.

Steps (each recorded, a failing step does not stop the others):
  1. daemon: xpu-healthd on the real backend for a minute at the default interval; /metrics scraped every 5 s;
     checks: backend is nvml, every card up, no sample failures, no call timeouts, no active fault series, identity
     and memory size agree with nvidia-smi; CPU share of one core, RSS, /metrics latency of the real process.
  2. overhead: bench/nvml_overhead.py (backend and sampler vs the raw NVML calls they make, same process).
  3. throughput: bf16 matmul TFLOP/s alone, with the daemon at the default interval, at 10x that rate, alone again;
     while it runs, the daemon's utilization, power and process readings are scraped (it must see the load).
  4. peers, one after another on the same card at a 1 s interval: xpu-healthd, nvitop-exporter, and
     nvidia-smi --query-gpu: scrape (or call) latency, CPU per sample, resident memory.
Reads only. It never changes MIG mode, clocks, power limit, compute mode or persistence mode; it records those
settings before and after and reports whether they are unchanged.

    python3 bench/device_check.py --out DIR [--quick] [--contract-rc N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, median, percentile, proc_cpu_seconds, proc_status_kib
from bench.daemon_bench import DaemonRun
from bench.daemon_bench import http_get as get
from bench.device_report import summary
from bench.metrics_bench import PROMETHEUS_ACCEPT

REPO = Path(__file__).resolve().parent.parent
SETTINGS_QUERY = "index,uuid,mig.mode.current,compute_mode,persistence_mode,power.limit,clocks.applications.graphics"
SMI_FIELDS = (
    "index,uuid,name,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,"
    "power.draw,power.limit,clocks.sm,clocks.mem,pstate,pcie.link.gen.current,ecc.errors.uncorrected.volatile.total"
)
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEnaNIf]+)$", re.MULTILINE)


def series(text: str) -> list[tuple[str, str, float]]:
    return [(m.group(1), m.group(2) or "", float(m.group(3))) for m in SERIES.finditer(text)]


def nvidia_smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [[v.strip() for v in line.split(",")] for line in out.strip().splitlines()]


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


def burst(port: int, n: int) -> dict[str, float]:
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    times = [get(port, "/metrics", headers)[2] for _ in range(n)]
    return {"scrape_p50_ms": median(times) * 1e3, "scrape_p99_ms": percentile(times, 0.99) * 1e3}


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_real_daemon(root: Path, interval: float | None) -> DaemonRun:
    run = DaemonRun(0, 0, root, interval=interval, real=True)
    run.start()
    try:
        run.wait_ready(90)
    except RuntimeError:
        run.stop()
        raise
    run.discover_gpus()
    return run


# ----- step 1: the daemon on the real backend -------------------------------------------------------------------


def health_problems(text: str) -> list[str]:
    """What in one /metrics body says the daemon or a card is not well (the 'no false faults' check)."""
    problems = []
    found = series(text)
    if not any(n == "xpu_backend_info" and 'backend="nvml"' in labels for n, labels, _ in found):
        problems.append("xpu_backend_info does not say backend=nvml (running on a simulation?)")
    for name, labels, value in found:
        if name == "xpu_backend_up" and value != 1:
            problems.append("xpu_backend_up is 0")
        elif name == "xpu_gpu_up" and value != 1:
            problems.append(f"xpu_gpu_up{labels} is 0")
        elif name == "xpu_gpu_sample_failure" and value > 0:
            problems.append(f"xpu_gpu_sample_failure{labels}")
        elif name == "xpu_backend_call_timeouts_total" and value > 0:
            problems.append(f"xpu_backend_call_timeouts_total{labels} = {value:g}")
        elif name == "xpu_collector_success" and value != 1:
            problems.append(f"xpu_collector_success{labels} is 0")
        elif re.match(r"xpu_(health|fault)", name) and re.search(r"active|open|firing", name) and value > 0:
            problems.append(f"fault series {name}{labels} = {value:g}")
    return problems


def step_daemon(seconds: float, work: Path, out: Path) -> dict[str, Any]:
    run = start_real_daemon(work / "real", None)
    result: dict[str, Any] = {"gpus": run.gpus}
    try:
        run.begin()
        problems: list[str] = []
        errors: dict[str, float] = {}
        scrapes = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            text = run.metrics_text()
            scrapes += 1
            problems += [p for p in health_problems(text) if p not in problems]
            errors.update({labels: v for name, labels, v in series(text) if name == "xpu_backend_call_errors_total"})
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        run.end_window()
        text = run.metrics_text()
        by_metric = {r.metric.strip(): r.value for r in run.rows()}
        result.update(
            {
                "scrapes": scrapes,
                "problems": problems,
                "call_errors": errors,
                "cpu_share_percent": by_metric["daemon CPU share of one core"],
                "cpu_per_cycle_ms": by_metric["CPU per sampling cycle, scrapes included"],
                "rss_mib": run.rss_mib,
                "peak_rss_mib": run.hwm_mib,
                "threads": run.threads,
                "scrape_p50_ms": by_metric["daemon /metrics p50 (real process)"],
                "scrape_p99_ms": by_metric["daemon /metrics p99 (real process)"],
            }
        )
        smi = {r[1]: r for r in nvidia_smi("index,uuid,memory.total")}
        mismatches = []
        for name, labels, value in series(text):
            if name == "xpu_gpu_memory_total_bytes":
                uuid = re.search(r'uuid="([^"]+)"', labels)
                row = smi.get(uuid.group(1)) if uuid else None
                if row is None:
                    mismatches.append(f"{labels}: uuid not listed by nvidia-smi")
                elif abs(value / 2**20 - float(row[2])) > 1:
                    mismatches.append(f"{labels}: memory total {value / 2**20:.0f} MiB vs nvidia-smi {row[2]} MiB")
        result["nvidia_smi_mismatches"] = mismatches
        result["log_warnings"] = sum(
            1
            for line in run.log.read_text(errors="replace").splitlines()
            if re.search(r'"level": "(warning|error)"', line)
        )
        result["ok"] = not problems and not mismatches
    finally:
        run.stop()
        shutil.copy(run.log, out / "daemon-real.log")
    return result


# ----- step 2: NVML overhead ----------------------------------------------------------------------------------


def step_overhead(reps: int, out: Path) -> dict[str, Any]:
    from bench.nvml_overhead import measure

    results = measure(reps)
    (out / "nvml_overhead.json").write_text(json.dumps(results, indent=1))
    return results


# ----- step 3: GPU throughput with and without the daemon ------------------------------------------------------


WATCH_EVERY_SECONDS = 3.0  # how often the daemon is scraped while the matmul runs (its CPU share includes these)


def matmul(seconds: float, watch: Callable[[], None] | None = None) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "gpu_throughput.py"), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    next_watch = time.monotonic()
    while proc.poll() is None:
        if watch is not None and time.monotonic() >= next_watch:
            watch()
            next_watch += WATCH_EVERY_SECONDS
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"gpu_throughput.py exited with {proc.returncode}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def step_throughput(seconds: float, work: Path) -> dict[str, Any]:
    phases: dict[str, Any] = {"alone": matmul(seconds)}
    for label, interval in (("daemon_default_5s", None), ("daemon_10x_0.5s", 0.5)):
        run = start_real_daemon(work / f"tp-{label}", interval)
        seen: dict[str, float] = {"utilization_max": 0.0, "power_max_watts": 0.0, "processes_max": 0.0}

        def watch(run: DaemonRun = run, seen: dict[str, float] = seen) -> None:
            for name, _, value in series(run.metrics_text()):
                key = {
                    "xpu_gpu_utilization_ratio": "utilization_max",
                    "xpu_gpu_power_watts": "power_max_watts",
                    "xpu_gpu_processes": "processes_max",
                }.get(name)
                if key:
                    seen[key] = max(seen[key], value)

        try:
            run.begin()
            result = matmul(seconds, watch)
            run.end_window()
            result["daemon_cpu_share_percent"] = (run.cpu1 - run.cpu0) / (run.t1 - run.t0) * 100
            result.update(seen)
            phases[label] = result
        finally:
            run.stop()
    phases["alone_again"] = matmul(seconds)
    base = (phases["alone"]["tflops"] + phases["alone_again"]["tflops"]) / 2
    for phase in phases.values():
        phase["vs_alone"] = phase["tflops"] / base
    return phases


# ----- step 4: peers on the same card -------------------------------------------------------------------------


def measure_process(proc: subprocess.Popen[bytes], port: int, window: float) -> dict[str, float]:
    cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
    time.sleep(window)
    cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
    return {
        "cpu_seconds": cpu1 - cpu0,
        "window_seconds": t1 - t0,
        "rss_mib": proc_status_kib(proc.pid, "VmRSS") / 1024,
        **burst(port, 30),
    }


def run_with_rusage(argv: list[str]) -> tuple[int, float, float, int]:
    """(exit status, wall s, CPU s, max RSS KiB) of one child, from its own rusage."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def step_peers(window: float, work: Path, out: Path) -> dict[str, Any]:
    interval = 1.0
    peers: dict[str, Any] = {}
    run = start_real_daemon(work / "peer-xpu", interval)
    try:
        assert run.proc is not None
        cycles0 = run.cycles()
        m = measure_process(run.proc, run.port, window)
        cycles = run.cycles() - cycles0
        m["cpu_per_sample_ms"] = m["cpu_seconds"] / max(cycles, 1) * 1e3
        m["samples"] = cycles
        peers["xpu-healthd"] = m
    except Exception as exc:
        peers["xpu-healthd"] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        run.stop()

    port = free_port()
    log = (out / "nvitop-exporter.log").open("wb")
    argv = [sys.executable, "-m", "nvitop_exporter", "--hostname", "localhost", "--bind-address", "127.0.0.1"]
    argv += ["--port", str(port)]
    proc = subprocess.Popen(
        [*argv, "--interval", str(interval)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(port, "/metrics", proc, 60)
        m = measure_process(proc, port, window)
        m["samples"] = m["window_seconds"] / interval  # its loop runs one update per interval
        m["cpu_per_sample_ms"] = m["cpu_seconds"] / m["samples"] * 1e3
        peers["nvitop-exporter"] = m
    except Exception as exc:
        peers["nvitop-exporter"] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        stop_process(proc)
        log.close()

    try:
        peers["nvidia-smi --query-gpu"] = measure_nvidia_smi(30)
    except Exception as exc:
        peers["nvidia-smi --query-gpu"] = {"error": f"{type(exc).__name__}: {exc}"}
    return peers


def measure_nvidia_smi(n: int) -> dict[str, Any]:
    calls = [run_with_rusage(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"]) for _ in range(n)]
    failed = sum(1 for rc, *_ in calls if rc != 0)
    return {
        "calls": len(calls),
        "failed": failed,
        "scrape_p50_ms": median([c[1] for c in calls]) * 1e3,
        "scrape_p99_ms": percentile([c[1] for c in calls], 0.99) * 1e3,
        "cpu_per_sample_ms": sum(c[2] for c in calls) / len(calls) * 1e3,
        "rss_mib": max(c[3] for c in calls) / 1024,
        "fields": SMI_FIELDS.count(",") + 1,
    }


# ----- orchestration (the summary text: device_report.py) -------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="shorter windows (about 2 minutes)")
    ap.add_argument("--contract-rc", type=int, help="exit status of the contract tests (device_check.sh)")
    ap.add_argument("--only", action="append", choices=["daemon", "overhead", "throughput", "peers"])
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "contract_rc": ns.contract_rc,
        "steps": {},
    }
    try:
        before = nvidia_smi(SETTINGS_QUERY)
        results["settings_before"] = before
        results["gpu"] = " / ".join(", ".join(r) for r in nvidia_smi("name,driver_version"))
    except Exception as exc:
        before = None
        results["settings_before"] = f"nvidia-smi failed: {exc}"
    daemon_s, tp_s, peer_s, reps = (30.0, 6.0, 15.0, 50) if ns.quick else (60.0, 10.0, 30.0, 200)
    steps: dict[str, Callable[[Path], Any]] = {
        "daemon": lambda w: step_daemon(daemon_s, w, ns.out),
        "overhead": lambda w: step_overhead(reps, ns.out),
        "throughput": lambda w: step_throughput(tp_s, w),
        "peers": lambda w: step_peers(peer_s, w, ns.out),
    }
    with tempfile.TemporaryDirectory(prefix="xpu-device-check-") as tmp:
        for name, fn in steps.items():
            if ns.only and name not in ns.only:
                continue
            print(f"device_check: {name} ...", flush=True)
            started = time.monotonic()
            try:
                results["steps"][name] = fn(Path(tmp))
            except Exception as exc:
                traceback.print_exc()
                results["steps"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"device_check: {name} done in {time.monotonic() - started:.0f} s", flush=True)
    try:
        after = nvidia_smi(SETTINGS_QUERY)
        results["settings_after"] = after
        results["settings_unchanged"] = before is not None and after == before
    except Exception as exc:
        results["settings_after"] = f"nvidia-smi failed: {exc}"
        results["settings_unchanged"] = None
    (ns.out / "device_results.json").write_text(json.dumps(results, indent=1, default=str))
    text = summary(results)
    (ns.out / "summary.txt").write_text(text + "\n")
    print(text)
    failed = (
        any("error" in s for s in results["steps"].values()) or results["steps"].get("daemon", {}).get("ok") is False
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
