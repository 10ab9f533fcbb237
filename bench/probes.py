"""Cost of one probe evaluation per Snapshot on the simulated 8x H200 node, and of the kmsg parser.

Probes run on the sampler thread after every cycle, so they must cost little next to the sampling interval (5 s).
The driver and memory-leak probes read the real /proc of this machine (pid liveness, D-state scan).
Run from the repository root: PYTHONPATH=. python3 bench/probes.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from healthd.probes import HealthSettings, ProbeHost, default_probes
from healthd.xid.catalog import load_catalog
from healthd.xid.kmsg import KmsgRecord, format_record, format_xid, parse_nvrm, parse_record
from healthd.xid.watcher import XidWatcher


class _Null:
    def event(self, finding: object) -> None:
        pass


def main() -> None:
    clock_t = [1_800_000_000.0]
    backend = SimulatedBackend(load_scenario("h200x8"), clock=lambda: clock_t[0])
    sampler = Sampler(backend, SamplerSettings(5.0, 2.0), clock=lambda: clock_t[0])
    with tempfile.TemporaryDirectory() as state:
        probes = default_probes(HealthSettings(), ProbeHost(Path("/proc"), Path("/sys"), Path(state)))
        snaps = []
        for _ in range(50):
            clock_t[0] += 5
            snaps.append(sampler.run_once())
        sampler.stop(1.0)
        print(
            f"probe evaluation on h200x8 (8 GPUs), {len(snaps)} snapshots, /proc has "
            f"{sum(1 for p in Path('/proc').iterdir() if p.name.isdigit())} processes"
        )
        total = []
        for probe in probes:
            times = []
            for snap in snaps:
                t0 = time.perf_counter()
                probe.evaluate(snap, snap.taken_at)
                times.append(time.perf_counter() - t0)
            total.append(statistics.median(times))
            print(f"  {probe.name:14s} median {statistics.median(times) * 1e6:8.1f} us  max {max(times) * 1e6:8.1f} us")
        print(f"  all probes     median sum {sum(total) * 1e3:.2f} ms per snapshot")

    lines = [
        format_record(KmsgRecord(4, i, i, "-", format_xid("0000:3a:00", 13, "Graphics SM Warp Exception", pid=i)))
        for i in range(20000)
    ]
    t0 = time.perf_counter()
    for line in lines:
        r = parse_record(line)
        assert r is not None
        parse_nvrm(r.message)
    dt = time.perf_counter() - t0
    print(f"kmsg parse: {len(lines) / dt:,.0f} NVRM Xid records/s ({dt / len(lines) * 1e6:.1f} us each)")

    watcher = XidWatcher(backend, None, load_catalog(), _Null(), lambda: clock_t[0], lambda: snaps[-1])
    records = [parse_record(line) for line in lines]
    t0 = time.perf_counter()
    for r in records:
        assert r is not None
        watcher.on_kmsg_record(r)
    dt = time.perf_counter() - t0
    print(
        f"xid merge: {len(records) / dt:,.0f} records/s through parse+map+merge "
        f"({watcher.merger.emitted} emitted, {watcher.merger.merged} merged)"
    )


if __name__ == "__main__":
    main()
