"""The real daemon as a process: CPU share of one core at the default interval, resident memory, /metrics latency.

Each point runs ``python3 -m healthd --simulate <generated scenario>`` with no config file (so the default 5 s
sampling interval and info logging), a private port, socket and state directory. After the daemon reports healthy,
its CPU time (utime + stime of all threads, /proc/<pid>/stat) is read, a scraper fetches /metrics every 15 s as
Prometheus would, and at the end CPU and RSS (/proc/<pid>/status) are read again: the share is the CPU time over the
wall time between the two reads. All points run at the same time to keep the suite short: they are idle between
cycles, so they barely compete (CPU time is counted per process either way). A burst of back-to-back scrapes after
the window gives the real process's /metrics p50/p99.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import BenchArgs, Row, free_port, median, percentile, proc_cpu_seconds, proc_status_kib
from bench.metrics_bench import PROMETHEUS_HEADERS
from bench.scenarios import write_scenario

NAME = "daemon"
REPO = Path(__file__).resolve().parent.parent
SCRAPE_EVERY_SECONDS = 15.0
BURST_SCRAPES = 50
READY_TIMEOUT_SECONDS = 120.0
GPUS = re.compile(r"^xpu_gpus ([0-9.e+]+)$", re.MULTILINE)
CALLS_SAMPLE = re.compile(r'^xpu_backend_calls_total\{call="sample"\} ([0-9.e+]+)$', re.MULTILINE)


def _optional_status(pid: int, key: str) -> float:
    try:
        return float(proc_status_kib(pid, key))
    except KeyError:
        return float("nan")


def http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
    """One GET on a fresh loopback connection: (status, body, seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        t = time.perf_counter()
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, body, time.perf_counter() - t
    finally:
        conn.close()


@dataclass
class DaemonRun:
    """One xpu-healthd process. ``gpus=0`` with ``real=True``: the real driver, GPU count read from /metrics."""

    gpus: int
    processes_per_gpu: int
    root: Path
    interval: float | None = None  # None: the default (5 s), no config file
    real: bool = False  # real NVML: a config file is given, so the daemon cannot fall back to a simulation
    scenario: str | None = None  # --simulate this (a built-in name or a file) instead of a generated scaled node
    config: str = ""  # more of the config file (TOML sections other than [sampler]); written when not empty
    umask: int | None = None  # the daemon's umask (the packaged unit's is 0o027); None: inherited
    repo: Path = REPO  # the tree the daemon runs from (another checkout: a baseline to compare with)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    cpu_ready: float = 0.0
    cpu0: float = 0.0
    t0: float = 0.0
    cycles0: float = 0.0
    scrapes: list[float] = field(default_factory=list)
    cpu1: float = 0.0
    t1: float = 0.0
    cycles1: float = 0.0
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    threads: float = 0.0

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "healthd"]
        if self.scenario is not None:
            args += ["--simulate", self.scenario]
        elif not self.real:
            scenario = write_scenario(self.root / "scenario.toml", self.gpus, self.processes_per_gpu)
            args += ["--simulate", str(scenario)]
        if self.real or self.interval is not None or self.config:
            config = self.root / "healthd.toml"
            sampler = "" if self.interval is None else f"[sampler]\ninterval_seconds = {self.interval}\n"
            config.write_text(sampler + self.config)
            args += ["--config", str(config)]
        args += [
            "--metrics-listen",
            f"127.0.0.1:{self.port}",
            "--grpc-listen",
            f"unix:{self.root / 'healthd.sock'}",
            "--state-dir",
            str(self.root / "state"),
        ]
        env = {**os.environ, "PYTHONPATH": str(self.repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,
                umask=-1 if self.umask is None else self.umask,
            )

    def metrics_text(self) -> str:
        status, body, _ = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"daemon ({self.gpus} GPUs): /metrics answered {status}")
        return body.decode()

    def discover_gpus(self) -> int:
        m = GPUS.search(self.metrics_text())
        if m is None:
            raise RuntimeError("daemon: no xpu_gpus in /metrics")
        self.gpus = int(float(m.group(1)))
        return self.gpus

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
        return http_get(self.port, path, headers)

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon ({self.gpus} GPUs) exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Poll /healthz until it answers 200; RuntimeError with the log's tail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                what = "real daemon" if self.real else f"daemon ({self.gpus} GPUs)"
                raise RuntimeError(f"{what} not healthy in {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def cycles(self) -> float:
        """Sampling cycles so far: per-card ``sample`` calls over the card count."""
        m = CALLS_SAMPLE.search(self.metrics_text())
        if m is None:
            raise RuntimeError(f"daemon ({self.gpus} GPUs): no xpu_backend_calls_total{{call=sample}} in /metrics")
        return float(m.group(1)) / max(self.gpus, 1)

    def begin(self) -> None:
        assert self.proc is not None
        self.cpu_ready = proc_cpu_seconds(self.proc.pid)
        self.cycles0 = self.cycles()
        self.cpu0, self.t0 = proc_cpu_seconds(self.proc.pid), time.monotonic()

    def scrape(self) -> None:
        status, _, seconds = self.get("/metrics", PROMETHEUS_HEADERS)
        if status != 200:
            raise RuntimeError(f"daemon ({self.gpus} GPUs): /metrics answered {status}")
        self.scrapes.append(seconds)

    def end_window(self) -> None:
        """Read CPU, memory and cycle count at the end of the window (before any burst loads the daemon)."""
        assert self.proc is not None
        pid = self.proc.pid
        self.cpu1, self.t1 = proc_cpu_seconds(pid), time.monotonic()
        self.rss_mib = proc_status_kib(pid, "VmRSS") / 1024
        self.hwm_mib = _optional_status(pid, "VmHWM") / 1024  # some sandboxes' /proc leave these out
        self.threads = _optional_status(pid, "Threads")  # a plain count on that line
        self.cycles1 = self.cycles()

    def rows(self) -> list[Row]:
        burst = [self.get("/metrics", PROMETHEUS_HEADERS)[2] for _ in range(BURST_SCRAPES)]
        cpu, wall, cycles = self.cpu1 - self.cpu0, self.t1 - self.t0, self.cycles1 - self.cycles0
        g, procs = self.gpus, self.gpus * self.processes_per_gpu
        window = f"{self.interval or 5:g} s interval, {wall:.0f} s window, {len(self.scrapes)} scrapes"
        return [
            Row("daemon CPU share of one core", "%", cpu / wall * 100, g, procs, note=window),
            Row("  CPU per sampling cycle, scrapes included", "ms", cpu / max(cycles, 1) * 1e3, g, procs),
            Row("daemon resident memory (RSS)", "MiB", self.rss_mib, g, procs),
            Row("  peak RSS (VmHWM)", "MiB", self.hwm_mib, g, procs),
            Row("  threads", "", self.threads, g, procs),
            Row("  CPU to start (imports, first cycle)", "s", self.cpu_ready, g, procs),
            Row("daemon /metrics p50 (real process)", "ms", median(burst) * 1e3, g, procs, note="back to back"),
            Row("daemon /metrics p99 (real process)", "ms", percentile(burst, 0.99) * 1e3, g, procs),
        ]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def measure(points: list[tuple[int, int]], seconds: float, work_dir: Path) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="xpu-bench-daemon-", dir=work_dir) as tmp:
        runs = [DaemonRun(g, p, Path(tmp) / f"g{g}-p{p}") for g, p in points]
        try:
            for run in runs:
                run.start()
            deadline = time.monotonic() + READY_TIMEOUT_SECONDS  # one for all: they started together
            for run in runs:
                run.wait_ready(deadline - time.monotonic())
            for run in runs:
                run.begin()
            start = time.monotonic()
            next_scrape = start
            while True:
                now = time.monotonic()
                if now >= start + seconds:
                    break
                if now >= next_scrape:
                    for run in runs:
                        run.scrape()
                    next_scrape += SCRAPE_EVERY_SECONDS
                time.sleep(max(0.0, min(next_scrape, start + seconds) - time.monotonic()))
            for run in runs:
                run.end_window()
            rows: list[Row] = []
            for run in runs:
                rows += run.rows()
            return rows
        finally:
            for run in runs:
                run.stop()


def run(args: BenchArgs) -> list[Row]:
    per_gpu = sorted({min(args.processes_per_gpu), max(args.processes_per_gpu)})
    points = [(g, p) for p in per_gpu for g in args.daemon_gpu_counts]
    return measure(points, args.daemon_seconds, args.work_dir)
