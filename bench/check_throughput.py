"""Matmul loss: does the daemon sampling a card slow the card's own work? (a step of the device check)

One bf16 matmul process (bench/gpu_throughput.py --stream) runs through four phases of ``--seconds`` each: the card
alone, with xpu-healthd at its default 5 s interval, at ten times that rate (0.5 s), and alone again. Each phase's
TFLOP/s is the mean of the quarter-second rates inside it; ``vs_alone`` divides by the mean of the two alone
phases, so the ratio compares runs of one process on one warm card. While the daemon runs, its /metrics is read
every second for the utilization, power and process count it sees (it must see the load) and its CPU share.
``--rehearse``: the simulated node and a matmul that only sleeps (no numbers, the same path).

    python3 -m bench.check_throughput --out DIR [--seconds 3] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.check_daemon import series
from bench.daemon_bench import DaemonRun

REPO = Path(__file__).resolve().parent.parent
WATCHED = {"xpu_gpu_utilization_ratio": "utilization_max", "xpu_gpu_power_watts": "power_max_watts",
           "xpu_gpu_processes": "processes_max"}  # fmt: skip


def mean_rate(rates: list[tuple[float, float, float | None]], t0: float, t1: float) -> float | None:
    """Time-weighted mean of the (end, length, TFLOP/s) intervals wholly inside [t0, t1]; None when there is none
    or one has no number (the dry run)."""
    inside = [(dt, r) for t, dt, r in rates if t - dt >= t0 and t <= t1]
    if not inside or any(r is None for _, r in inside):
        return None
    return sum(dt * (r or 0.0) for dt, r in inside) / sum(dt for dt, _ in inside)


class Stream:
    """The matmul process and the rate lines it prints (t, dt, tflops)."""

    def __init__(self, seconds: float, dry_run: bool) -> None:
        argv = [sys.executable, str(REPO / "bench" / "gpu_throughput.py"), "--stream", "--seconds", f"{seconds:g}"]
        self.proc = subprocess.Popen([*argv, *(["--dry-run"] if dry_run else [])], stdout=subprocess.PIPE, text=True)
        self.rates: list[tuple[float, float, float | None]] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            item = json.loads(line)
            if "ready" in item:
                self.ready.set()
            else:
                self.rates.append((item["t"], item["dt"], item["tflops"]))
        self.ready.set()

    def mean(self, t0: float, t1: float) -> float | None:
        return mean_rate(list(self.rates), t0, t1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)  # it reads to the end of the pipe, then the pipe is closed
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def phase(stream: Stream, seconds: float, run: DaemonRun | None = None) -> dict[str, Any]:
    seen = dict.fromkeys(WATCHED.values(), 0.0)
    t0 = time.monotonic()
    if run is not None:
        run.begin()
    while time.monotonic() - t0 < seconds:
        if run is not None:
            for name, _, value in series(run.metrics_text()):
                if name in WATCHED:
                    seen[WATCHED[name]] = max(seen[WATCHED[name]], value)
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
    t1 = time.monotonic()
    time.sleep(0.3)  # the rate line that ends after t1 is out before it is read
    result: dict[str, Any] = {"tflops": stream.mean(t0, t1), "seconds": t1 - t0}
    if run is not None:
        run.end_window()
        result["daemon_cpu_share_percent"] = (run.cpu1 - run.cpu0) / (run.t1 - run.t0) * 100
        result.update(seen)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    ap.add_argument("--rehearse", action="store_true", help="the simulated node and a matmul that only sleeps")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"phase_seconds": args.seconds, "phases": {}}
    path = args.out / "result.json"
    stream = Stream(args.seconds * 4 + 120, args.rehearse)
    try:
        if not stream.ready.wait(90) or stream.proc.poll() is not None:
            raise RuntimeError(f"the matmul process did not start (exit status {stream.proc.poll()})")
        phases = result["phases"]
        phases["alone"] = phase(stream, args.seconds)
        for label, interval in (("daemon_default_5s", None), ("daemon_10x_0.5s", 0.5)):
            root = args.out / label
            # rehearsal: one simulated card with two processes, so the watcher has a load to see
            run = DaemonRun(1, 2, root, interval=interval) if args.rehearse else DaemonRun(0, 0, root, interval, True)
            run.start()
            try:
                run.wait_ready(60)
                phases[label] = phase(stream, args.seconds, run)
            finally:
                run.stop()
            path.write_text(json.dumps(result, indent=1) + "\n")
        phases["alone_again"] = phase(stream, args.seconds)
    finally:
        stream.stop()
    rates = [phases[p]["tflops"] for p in ("alone", "alone_again")]
    base = sum(rates) / 2 if all(isinstance(r, float) for r in rates) else None
    for p in phases.values():
        p["vs_alone"] = p["tflops"] / base if base and isinstance(p["tflops"], float) else None
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
