"""Cost of topology collection and of the best-connected-set search. Prints numbers; asserts nothing.

python3 bench/topology.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median, timed
from exporter.backends.scenario import load_scenario
from exporter.topology.allocation import preferred_allocation
from exporter.topology.discover import GpuIdentity, read_topology
from exporter.topology.layout import simulated_sysfs
from exporter.topology.model import Gpu, Link, LinkKind, PcieLocation, Topology
from exporter.topology.sysfs import Sysfs


def median_max_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = timed(fn, repeat)
    return median(samples) * 1000, max(samples) * 1000


def synthetic(n: int, seed: int) -> Topology:
    """n GPUs in PCIe switches of 2, host bridges of 4, sockets of n/2, NVLink pairs at random."""
    rnd = random.Random(seed)
    loc = PcieLocation("0000:00:00.0", "pci0000:00", (), 0, 0, "")
    links: dict[tuple[int, int], Link] = {}
    pcie: dict[tuple[int, int], Link] = {}
    for a in range(n):
        for b in range(n):
            if a == b:
                kind = LinkKind.SELF
            elif a // 2 == b // 2:
                kind = LinkKind.PIX
            elif a // 4 == b // 4:
                kind = LinkKind.PHB
            elif a // (n // 2) == b // (n // 2):
                kind = LinkKind.NODE
            else:
                kind = LinkKind.SYS
            pcie[(a, b)] = Link(kind)
    for a in range(n):
        for b in range(a, n):
            nv = rnd.choice([0, 0, 0, 2, 4]) if a != b else 0
            links[(a, b)] = links[(b, a)] = Link(LinkKind.NVLINK, nv) if nv else pcie[(a, b)]
    gpus = tuple(Gpu(i, f"GPU-{i}", "x", loc, None) for i in range(n))
    return Topology(gpus, (), links, {}, pcie, (0,), (0,), "synthetic", 0.0)


def main() -> int:
    scenario = load_scenario("h200x8")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        root = simulated_sysfs(scenario.extra, [c.pci_bus_id for c in scenario.cards], Path(tmp) / "sys")
        print(f"write simulated h200x8 sysfs tree: {(time.perf_counter() - start) * 1000:.1f} ms")
        assert root is not None
        ids = [GpuIdentity(c.index, c.uuid, scenario.model, c.pci_bus_id) for c in scenario.cards]
        peers: dict[int, tuple[str, ...] | None] = {c.index: ("nvswitch",) * 18 for c in scenario.cards}
        med, worst = median_max_ms(lambda: read_topology(Sysfs(root), ids, peers, collected_at=0.0), 50)
        print(f"read_topology h200x8 (8 GPUs, 8 NICs) from sysfs: median {med:.2f} ms, max {worst:.2f} ms")
        topology = read_topology(Sysfs(root), ids, peers, collected_at=0.0)
    for count in (1, 2, 4, 8):
        med, worst = median_max_ms(lambda c=count: preferred_allocation(topology, c), 20)
        print(f"preferred_allocation h200x8 count={count}: median {med:.2f} ms, max {worst:.2f} ms")
    for n, count in ((16, 8), (16, 4), (16, 2), (32, 8)):
        topo = synthetic(n, seed=n)
        med, worst = median_max_ms(lambda t=topo, c=count: preferred_allocation(t, c), 5)
        exact = preferred_allocation(topo, count).exact
        print(
            f"preferred_allocation synthetic n={n} count={count} ({'exact' if exact else 'greedy'}): "
            f"median {med:.1f} ms, max {worst:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
