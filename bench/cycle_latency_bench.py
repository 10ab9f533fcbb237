"""Request latency across the sampling cycle: how long a request waits while the daemon's own cycle runs.

A scrape is served bytes rendered before, but its threads still need the GIL. Once per cycle the sampler hands
every card's calls to the lanes and then its subscribers (attribution, the probes, the render) run their Python;
a request that comes in that stretch waits behind them. Prometheus scrapes at a fixed phase, so a scraper whose
phase falls in that stretch meets it at every scrape. This bench shows the stretch: one daemon per tree
(``python3 -m healthd --simulate``, no config file: 5 s interval), scraped with Prometheus' headers every 15 s
from the moment it is healthy, and probed on ``/healthz`` over a kept-alive connection every 5-20 ms (random
gaps, so every phase of the cycle is met). Each probe's latency is placed at its phase in the cycle: seconds after
card 0's last sample (``xpu_gpu_last_sample_timestamp_seconds``, read at the end), which is stamped once all of
the fan-out's rounds have answered. With ``--baseline DIR`` the two trees take turns (``--rounds`` each, one
daemon running at a time), so both meet the same machine.

    python3 bench/cycle_latency_bench.py [--node h200x64-busy] [--seconds 60] [--baseline DIR] [--rounds 2]

Printed per tree: p50, p99, max, the share of probes over 5 ms, the daemon's CPU share over the probing, the
slowest scrape; then the slow probes by 100 ms of phase.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import http.client
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, proc_cpu_seconds
from bench.daemon_bench import REPO, DaemonRun
from bench.metrics_bench import PROMETHEUS_HEADERS
from bench.scrape_bench import NODES, wait_until_attributed

SLOW_MS = 5.0
SCRAPE_EVERY = 15.0
CARD0_SAMPLED = re.compile(r'^xpu_gpu_last_sample_timestamp_seconds\{gpu="0"[^}]*\} (\S+)$', re.MULTILINE)


@dataclass
class Probes:
    """One round of one tree: (wall time, seconds) of every probe, the scrapes' seconds, the cycle's reference."""

    tree: str
    probes: list[tuple[float, float]] = field(default_factory=list)
    scrapes: list[float] = field(default_factory=list)
    card0_sampled: float = 0.0
    interval: float = 5.0
    cpu_seconds: float = 0.0  # the daemon's CPU time over the probing (the probes' own answers included)
    wall_seconds: float = 0.0


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None) -> tuple[bytes, float]:
    started = time.perf_counter()
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status}")
    return body, time.perf_counter() - started


def probe_round(tree: str, repo: Path, node_name: str, seconds: float, work: Path) -> Probes:
    node = NODES[node_name]
    work.mkdir(parents=True, exist_ok=True)
    root = work / tree
    run = DaemonRun(node.gpus, 0, root, scenario=node.scenario(work), repo=repo)
    out = Probes(tree)
    run.start()
    try:
        wait_until_attributed(run, node)
        prober = http.client.HTTPConnection("127.0.0.1", run.port, timeout=30)
        scraper = http.client.HTTPConnection("127.0.0.1", run.port, timeout=60)
        assert run.proc is not None
        cpu0, t0 = proc_cpu_seconds(run.proc.pid), time.monotonic()
        end = t0 + seconds
        next_scrape = t0
        while time.monotonic() < end:
            if time.monotonic() >= next_scrape:
                out.scrapes.append(_get(scraper, "/metrics", PROMETHEUS_HEADERS)[1])
                next_scrape += SCRAPE_EVERY
            at = time.time()
            out.probes.append((at, _get(prober, "/healthz")[1]))
            time.sleep(random.uniform(0.005, 0.020))
        out.cpu_seconds, out.wall_seconds = proc_cpu_seconds(run.proc.pid) - cpu0, time.monotonic() - t0
        body, _ = _get(prober, "/metrics?name[]=xpu_gpu_last_sample_timestamp_seconds")
        match = CARD0_SAMPLED.search(body.decode())
        if match is None:
            raise RuntimeError("no xpu_gpu_last_sample_timestamp_seconds for card 0")
        out.card0_sampled = float(match.group(1))
        prober.close()
        scraper.close()
    finally:
        run.stop()
    return out


def phase(p: Probes, at: float) -> float:
    """Seconds after card 0's sample in the cycle ``at`` falls in: in [-1, interval - 1)."""
    return (at - p.card0_sampled + 1.0) % p.interval - 1.0


def report(rounds: list[Probes]) -> None:
    trees = sorted({r.tree for r in rounds}, key=[r.tree for r in rounds].index)
    print(
        f"{'tree':<10} {'probes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'> 5 ms':>8} {'CPU':>7}  scrapes max ms"
    )
    for tree in trees:
        mine = [r for r in rounds if r.tree == tree]
        ms = [s * 1e3 for r in mine for _, s in r.probes]
        slow = sum(1 for v in ms if v > SLOW_MS)
        scrapes = [s * 1e3 for r in mine for s in r.scrapes]
        cpu = sum(r.cpu_seconds for r in mine) / sum(r.wall_seconds for r in mine) * 100
        print(
            f"{tree:<10} {len(ms):>7} {percentile(ms, 0.5):>8.2f} {percentile(ms, 0.99):>8.2f} {max(ms):>8.2f} "
            f"{slow / len(ms) * 100:>7.2f}% {cpu:>6.2f}%  {max(scrapes):.2f}"
        )
    print(f"\nprobes over {SLOW_MS:g} ms by phase (s after card 0's sample; 100 ms bins with any):")
    for tree in trees:
        bins: Counter[float] = Counter()
        for r in (r for r in rounds if r.tree == tree):
            for at, s in r.probes:
                if s * 1e3 > SLOW_MS:
                    bins[round(phase(r, at) // 0.1 * 0.1, 1)] += 1
        shown = ", ".join(f"{b:+.1f}: {n}" for b, n in sorted(bins.items()))
        print(f"  {tree:<10} {shown or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", choices=sorted(NODES), default="h200x64-busy")
    ap.add_argument("--seconds", type=float, default=60.0, help="probing time of each round")
    ap.add_argument("--baseline", type=Path, help="another checkout, run in turns with this tree")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each tree")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    trees = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    rounds: list[Probes] = []
    with tempfile.TemporaryDirectory(prefix="xpu-bench-cycle-", dir=args.work_dir) as tmp:
        for i in range(args.rounds):
            for tree, repo in trees if i % 2 == 0 else trees[::-1]:
                rounds.append(probe_round(tree, repo, args.node, args.seconds, Path(tmp) / f"{i}"))
    report(rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
