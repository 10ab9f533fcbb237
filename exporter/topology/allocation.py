"""Best-connected GPU sets (pure): which ``count`` cards of ``available`` talk over the shortest paths.

A set is ranked by, in order:
1. the worst pair link in the set (a ring or all-reduce runs at the speed of its slowest hop);
2. the sum of all pair link costs;
3. the sum of PCIe-only pair costs (on NVSwitch systems, where every pair is NV18, this keeps a set in one PCIe
   switch / NUMA node so its NICs and CPUs are local too);
4. the sum over the cards of their distance to the nearest RDMA NIC;
5. how well the set is connected to the cards left over, less is better (take the cards least useful to others,
   like HAMi's single-card rule, so well-connected groups stay whole for later requests);
6. the lowest indices (a stable answer).
Exact branch-and-bound search when at most ``EXACT_LIMIT`` cards are available (criteria 1-3 only grow as cards are
added, so a partial set already worse than the best full set is cut); a greedy search from every seed card above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.topology.model import NIC_LEVELS, Link, LinkKind, Topology

EXACT_LIMIT = 16


class AllocationError(ValueError):
    """The request cannot be met; ``reason`` is ``invalid`` (bad input) or ``exhausted`` (not enough cards)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NicChoice:
    name: str
    netdevs: tuple[str, ...]
    gpu: int  # the chosen card it is closest to
    link: Link
    level: str  # pcie_switch, pcie_host_bridge, numa_node, socket, cross_socket


@dataclass(frozen=True, slots=True)
class Allocation:
    gpus: tuple[int, ...]
    uuids: tuple[str, ...]
    nics: tuple[NicChoice, ...]  # every NIC, nearest first (switch, host bridge, NUMA node, socket, cross-socket)
    worst_link: Link
    total_cost: int
    exact: bool  # False when the greedy search was used (more than EXACT_LIMIT cards available)


def set_key(topology: Topology, gpus: Sequence[int], available: Sequence[int]) -> tuple[int, ...]:
    """The ranking key of a set (smaller is better), without the index tie-break."""
    chosen = sorted(gpus)
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    worst = max((topology.link(a, b).cost for a, b in pairs), default=0)
    total = sum(topology.link(a, b).cost for a, b in pairs)
    pcie = sum(topology.pcie_link(a, b).cost for a, b in pairs)
    nic = sum(_nic_cost(topology, g) for g in chosen)
    rest = [g for g in available if g not in chosen]
    spread = -sum(topology.link(a, r).cost for a in chosen for r in rest)
    return (worst, total, pcie, nic, spread)


def _nic_cost(topology: Topology, gpu: int) -> int:
    return min((topology.nic_links[(gpu, n.name)].cost for n in topology.nics), default=0)


def preferred_allocation(
    topology: Topology, count: int, available: Sequence[int] = (), must_include: Sequence[int] = ()
) -> Allocation:
    """The best-connected ``count`` cards among ``available`` (empty: all) that contain ``must_include``."""
    known = {g.index for g in topology.gpus}
    pool = sorted(set(available)) if available else sorted(known)
    required = sorted(set(must_include))
    if count < 1:
        raise AllocationError(f"count must be at least 1, got {count}", reason="invalid")
    for label, items in (("available", pool), ("must_include", required)):
        unknown = [g for g in items if g not in known]
        if unknown:
            raise AllocationError(f"{label}: no GPU {unknown[0]} on this node", reason="invalid")
    outside = [g for g in required if g not in pool]
    if outside:
        raise AllocationError(f"must_include: GPU {outside[0]} is not in available", reason="invalid")
    if len(required) > count:
        raise AllocationError(f"must_include has {len(required)} GPUs but count is {count}", reason="invalid")
    if count > len(pool):
        raise AllocationError(f"asked for {count} GPUs, only {len(pool)} available", reason="exhausted")
    exact = len(pool) <= EXACT_LIMIT
    chosen = _exact(topology, count, pool, required) if exact else _greedy(topology, count, pool, required)
    return _describe(topology, chosen, exact)


def _exact(topology: Topology, count: int, pool: list[int], required: list[int]) -> tuple[int, ...]:
    candidates = [g for g in pool if g not in required]
    need = count - len(required)
    best: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (key + indices, set)

    def partial(chosen: list[int]) -> tuple[int, int, int]:
        pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
        return (
            max((topology.link(a, b).cost for a, b in pairs), default=0),
            sum(topology.link(a, b).cost for a, b in pairs),
            sum(topology.pcie_link(a, b).cost for a, b in pairs),
        )

    def visit(start: int, chosen: list[int]) -> None:
        nonlocal best
        if best is not None and partial(chosen) > best[0][:3]:
            return  # criteria 1-3 never shrink as cards are added
        if len(chosen) == count:
            ordered = tuple(sorted(chosen))
            key = (*set_key(topology, ordered, pool), *ordered)
            if best is None or key < best[0]:
                best = (key, ordered)
            return
        left = count - len(chosen)
        for i in range(start, len(candidates) - left + 1):
            chosen.append(candidates[i])
            visit(i + 1, chosen)
            chosen.pop()

    if need == 0:
        return tuple(required)
    visit(0, list(required))
    assert best is not None
    return best[1]


def _greedy(topology: Topology, count: int, pool: list[int], required: list[int]) -> tuple[int, ...]:
    """From each seed, add the card that keeps (worst, sum, PCIe sum, NIC distance) smallest; best full set wins."""
    seeds = [required] if required else [[g] for g in pool]
    best: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    for seed in seeds:
        chosen = list(seed)
        pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
        worst = max((topology.link(a, b).cost for a, b in pairs), default=0)
        total = sum(topology.link(a, b).cost for a, b in pairs)
        pcie = sum(topology.pcie_link(a, b).cost for a, b in pairs)
        while len(chosen) < count:
            step = min(_grown(topology, chosen, g, worst, total, pcie) for g in pool if g not in chosen)
            worst, total, pcie = step[0], step[1], step[2]
            chosen.append(step[4])
        ordered = tuple(sorted(chosen))
        key = (*set_key(topology, ordered, pool), *ordered)
        if best is None or key < best[0]:
            best = (key, ordered)
    assert best is not None
    return best[1]


def _grown(topology: Topology, chosen: list[int], g: int, worst: int, total: int, pcie: int) -> tuple[int, ...]:
    """The greedy step's key for adding ``g``: (worst, sum, PCIe sum, NIC distance, index)."""
    costs = [topology.link(g, c).cost for c in chosen]
    return (
        max([worst, *costs]),
        total + sum(costs),
        pcie + sum(topology.pcie_link(g, c).cost for c in chosen),
        _nic_cost(topology, g),
        g,
    )


def _describe(topology: Topology, chosen: tuple[int, ...], exact: bool) -> Allocation:
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    worst = max((topology.link(a, b) for a, b in pairs), key=lambda link: link.cost, default=Link(LinkKind.SELF))
    nics: list[NicChoice] = []
    for nic in topology.nics:
        gpu = min(chosen, key=lambda g: (topology.nic_links[(g, nic.name)].cost, g))
        link = topology.nic_links[(gpu, nic.name)]
        nics.append(NicChoice(nic.name, nic.netdevs, gpu, link, NIC_LEVELS.get(link.kind, "unknown")))
    nics.sort(key=lambda n: (n.link.cost, n.gpu, n.name))
    uuids = tuple(g.uuid for i in chosen if (g := topology.gpu(i)) is not None)
    return Allocation(
        gpus=chosen,
        uuids=uuids,
        nics=tuple(nics),
        worst_link=worst,
        total_cost=sum(topology.link(a, b).cost for a, b in pairs),
        exact=exact,
    )
