"""xpu-healthd side by side with node_exporter and nvitop-exporter, in one interleaved run: CPU per scrape, CPU share
at a 5 s interval with one scrape every 15 s, scrape latency and resident memory, with ratios.

Four daemons run together on this machine and meet the same load at the same moments:

- ``xpu (capture)``: xpu-healthd on its real NVML backend over the H200 capture (one card; bench/capture_shim);
- ``nvitop-exporter``: nvitop-exporter 1.7.2 over the same capture, ``--interval 5``;
- ``xpu (h200x8-busy)``: xpu-healthd on the simulated 8-card node with 400 processes in 100 pods;
- ``node_exporter``: Debian's prometheus-node-exporter with its default collectors, on this machine's /proc and /sys.

Each is scraped every 15 s with Prometheus' headers (kept-alive connections), the four a quarter period apart, so
no two scrapes meet. CPU (/proc/<pid>/stat, all threads) is read over a window that opens after three scrapes
each; then each gets ``--burst`` back-to-back scrapes in turn (CPU per scrape). Nothing is asserted; numbers and
ratios are printed. On a shared machine the ratios are what counts.

Peers to install (not project dependencies):

    sudo apt-get install prometheus-node-exporter
    python3 -m venv ~/.cache/xpu-bench/nvitop && ~/.cache/xpu-bench/nvitop/bin/pip install nvitop-exporter==1.7.2 pytest

    python3 bench/peers_bench.py [--nvitop ~/.cache/xpu-bench/nvitop/bin/nvitop-exporter] [--window 120] [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, median, percentile, proc_cpu_seconds, proc_status_kib
from bench.metrics_bench import PROMETHEUS_HEADERS

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "bench" / "capture_shim"
EVERY = 15.0
WARMUP_ROUNDS = 3  # scrapes each before the CPU window: xpu-healthd has learned the rhythm by then
NVITOP_DEFAULT = Path.home() / ".cache" / "xpu-bench" / "nvitop" / "bin" / "nvitop-exporter"


@dataclass
class Peer:
    name: str
    args: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    conn: http.client.HTTPConnection | None = None
    rhythm: list[float] = field(default_factory=list)  # seconds per scrape in the 15 s rhythm
    burst: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    rss_mib: float = 0.0
    series: int = 0

    def start(self, root: Path) -> None:
        log = (root / f"{self.name.replace(' ', '_').strip('()')}.log").open("wb")
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)

    def scrape(self) -> tuple[float, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        started = time.perf_counter()
        self.conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
        reply = self.conn.getresponse()
        body = reply.read()
        seconds = time.perf_counter() - started
        if reply.status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {reply.status}")
        return seconds, body

    def cpu_now(self) -> float:
        assert self.proc is not None
        return proc_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def peers(root: Path, nvitop: Path, node_exporter: str) -> list[Peer]:
    capture_env = {"XPU_CAPTURE_SHIM": "1", "PYTHONPATH": f"{SHIM}{os.pathsep}{REPO}"}
    config = root / "healthd.toml"
    config.write_text("[sampler]\ninterval_seconds = 5\n")  # a config file: the real backend, no fallback

    def xpu(name: str, extra: list[str]) -> Peer:
        port = free_port()
        state = root / name.replace(" ", "_").strip("()")
        args = [sys.executable, "-m", "healthd", *extra, "--metrics-listen", f"127.0.0.1:{port}"]
        args += ["--grpc-listen", f"unix:{state}/h.sock", "--state-dir", str(state / "state")]
        state.mkdir(parents=True)
        return Peer(name, args, port)

    capture = xpu("xpu (capture)", ["--config", str(config)])
    capture.env = capture_env
    busy = xpu("xpu (h200x8-busy)", ["--simulate", "h200x8-busy"])
    busy.env = {"PYTHONPATH": str(REPO)}
    nv_port, ne_port = free_port(), free_port()
    nv = Peer("nvitop-exporter", [str(nvitop), "--port", str(nv_port), "--interval", "5"], nv_port, capture_env)
    ne = Peer("node_exporter", [node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"], ne_port)
    return [capture, nv, busy, ne]


def wait_ready(peer: Peer, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert peer.proc is not None
        if peer.proc.poll() is not None:
            raise RuntimeError(f"{peer.name} exited with {peer.proc.returncode}")
        try:
            _, body = peer.scrape()
            if peer.name.startswith("xpu") and b"xpu_gpu_up{" not in gzip_body(body):
                raise OSError("no card yet")
            return
        except (OSError, http.client.HTTPException):
            peer.conn = None
            time.sleep(0.2)
    raise RuntimeError(f"{peer.name} not ready in {timeout}s")


def gzip_body(body: bytes) -> bytes:
    import gzip

    return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body


def run(all_peers: list[Peer], window: float, burst: int) -> None:
    for peer in all_peers:
        wait_ready(peer)
    rounds = WARMUP_ROUNDS + max(1, round(window / EVERY))
    start = time.monotonic() + 1.0
    for r in range(rounds + 1):
        if r == WARMUP_ROUNDS:
            for peer in all_peers:  # the window opens a quarter period before the first scrape in it
                peer.cpu["open"], peer.cpu["t_open"] = peer.cpu_now(), time.monotonic()
        if r == rounds:
            break
        for i, peer in enumerate(all_peers):
            _sleep_until(start + r * EVERY + i * EVERY / len(all_peers))
            seconds, body = peer.scrape()
            if r >= WARMUP_ROUNDS:
                peer.rhythm.append(seconds)
            peer.series = sum(1 for line in gzip_body(body).splitlines() if line and not line.startswith(b"#"))
    _sleep_until(start + rounds * EVERY)
    for peer in all_peers:
        peer.cpu["close"], peer.cpu["t_close"] = peer.cpu_now(), time.monotonic()
        peer.cpu["burst0"] = peer.cpu_now()
    for _ in range(burst):  # in turn, so the four meet the same moments of load
        for peer in all_peers:
            peer.burst.append(peer.scrape()[0])
    for peer in all_peers:
        peer.cpu["burst1"] = peer.cpu_now()
        assert peer.proc is not None
        peer.rss_mib = proc_status_kib(peer.proc.pid, "VmRSS") / 1024


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def report(all_peers: list[Peer], burst: int) -> list[str]:
    by = {p.name: p for p in all_peers}
    figures: dict[str, dict[str, float]] = {}
    for p in all_peers:
        share = (p.cpu["close"] - p.cpu["open"]) / (p.cpu["t_close"] - p.cpu["t_open"])
        figures[p.name] = {
            "CPU per scrape (back to back), ms": (p.cpu["burst1"] - p.cpu["burst0"]) / burst * 1e3,
            "CPU share, 5 s interval, a scrape every 15 s, %": share * 100,
            "scrape in the rhythm: p50, ms": median(p.rhythm) * 1e3,
            "scrape in the rhythm: max, ms": max(p.rhythm) * 1e3,
            "back-to-back scrape: p99, ms": percentile(p.burst, 0.99) * 1e3,
            "resident memory, MiB": p.rss_mib,
            "series": float(p.series),
        }
    names = [p.name for p in all_peers]
    lines = ["  " + f"{'':<50}" + "".join(f"{n:>19}" for n in names)]
    lines += ["  " + f"{w:<50}" + "".join(f"{figures[n][w]:>19.3f}" for n in names) for w in figures[names[0]]]
    lines.append("  ratios (xpu / peer):")
    for ours, theirs in (("xpu (capture)", "nvitop-exporter"), ("xpu (h200x8-busy)", "node_exporter"),
                         ("xpu (capture)", "node_exporter")):  # fmt: skip
        if ours in by and theirs in by:
            parts = [
                f"{what.split(',')[0]} {figures[ours][what] / figures[theirs][what]:.3f}"
                for what in figures[ours]
                if figures[theirs][what]
            ]
            lines.append(f"    {ours} / {theirs}: " + "; ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvitop", type=Path, default=Path(shutil.which("nvitop-exporter") or NVITOP_DEFAULT))
    ap.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter") or "node_exporter")
    ap.add_argument("--window", type=float, default=120.0, help="seconds of the CPU window")
    ap.add_argument("--burst", type=int, default=200, help="back-to-back scrapes of each (CPU per scrape)")
    ap.add_argument("--quick", action="store_true", help="a 60 s window, 100 back-to-back scrapes")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args(argv)
    window, burst = (60.0, 100) if args.quick else (args.window, args.burst)
    for tool in (str(args.nvitop), args.node_exporter):
        if shutil.which(tool) is None:
            print(f"peers: {tool} not found; see the install note in bench/peers_bench.py", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="xpu-bench-peers-", dir=args.work_dir) as tmp:
        all_peers = peers(Path(tmp), args.nvitop, args.node_exporter)
        try:
            for peer in all_peers:
                peer.start(Path(tmp))
            run(all_peers, window, burst)
        finally:
            for peer in all_peers:
                peer.stop()
    print(f"== peers side by side: {window:.0f} s window, {burst} back-to-back scrapes each")
    print("\n".join(report(all_peers, burst)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
