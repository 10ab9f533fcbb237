"""Best-connected card sets: hand-computed answers on the fixture boxes, and optimality against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.topology.allocation import AllocationError, preferred_allocation, set_key
from exporter.topology.model import Gpu, Link, LinkKind, PcieLocation, Topology
from tests.support.topology_fixtures import fixture_topology


@pytest.mark.parametrize(
    ("count", "available", "must", "expected"),
    [
        (2, (), (), (0, 1)),  # PIX pair with a PIX NIC beats the other PIX pairs
        (3, (), (), (0, 1, 2)),  # PXB worst; {0,1,2} has two cards next to mlx5_0, {0,2,3} one
        (4, (), (), (0, 1, 2, 3)),  # worst PXB beats {4..7} (worst PHB)
        (8, (), (), tuple(range(8))),
        (2, (), (4,), (4, 5)),
        (2, (0, 2, 4, 6), (), (0, 2)),  # PXB beats PHB
        (2, (0, 4, 6), (), (4, 6)),  # PHB beats SYS
        (4, (0, 1, 4, 5, 6, 7), (), (4, 5, 6, 7)),  # {0,1,+2 of socket 1} would cross sockets
        (3, (), (6,), (4, 5, 6)),  # {4,5,6} and {4,6,7} tie (one PIX, two PHB): lowest indices
    ],
)
def test_pcie_switch_box(
    count: int, available: tuple[int, ...], must: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert preferred_allocation(fixture_topology("pcie_switch_8gpu"), count, available, must).gpus == expected


@pytest.mark.parametrize(
    ("count", "available", "must", "expected"),
    [
        (2, (), (), (0, 1)),  # all pairs NV18: same PCIe switch wins
        (4, (), (), (0, 1, 2, 3)),  # one NUMA node
        (8, (), (), tuple(range(8))),
        (2, (), (5,), (4, 5)),
        (2, (1, 2, 5, 6), (), (1, 2)),  # NV18 everywhere; 1-2 share a NUMA node (NODE < SYS over PCIe)
        (4, (), (3, 4), (2, 3, 4, 5)),  # must straddle sockets; partners from each card's own switch
    ],
)
def test_hgx_nvswitch_box(
    count: int, available: tuple[int, ...], must: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    alloc = preferred_allocation(fixture_topology("hgx_nvswitch"), count, available, must)
    assert alloc.gpus == expected
    if count > 1:
        assert alloc.worst_link == Link(LinkKind.NVLINK, 18)


def test_hgx_nics_grouped_nearest_first() -> None:
    alloc = preferred_allocation(fixture_topology("hgx_nvswitch"), 2, (), (6,))
    assert alloc.gpus == (6, 7)
    levels = [(n.name, n.level) for n in alloc.nics]
    assert levels[:2] == [("mlx5_6", "pcie_switch"), ("mlx5_7", "pcie_switch")]
    assert levels[2:4] == [("mlx5_4", "numa_node"), ("mlx5_5", "numa_node")]
    assert {lvl for _, lvl in levels[4:]} == {"cross_socket"}
    assert alloc.nics[0].netdevs == ("ibp187s0",)
    assert alloc.uuids == ("GPU-hgx_-6", "GPU-hgx_-7")


def test_pcie_nic_levels_include_socket_level() -> None:
    alloc = preferred_allocation(fixture_topology("pcie_switch_8gpu"), 2, (), (4,))
    assert [(n.name, n.level) for n in alloc.nics] == [
        ("mlx5_2", "numa_node"),
        ("mlx5_1", "socket"),
        ("mlx5_0", "cross_socket"),
    ]


@pytest.mark.parametrize(
    ("count", "available", "must", "reason", "text"),
    [
        (0, (), (), "invalid", "count"),
        (9, (), (), "exhausted", "only 8"),
        (2, (0, 1), (2,), "invalid", "not in available"),
        (1, (), (0, 1), "invalid", "must_include has 2"),
        (1, (12,), (), "invalid", "no GPU 12"),
        (3, (0, 1), (), "exhausted", "only 2"),
    ],
)
def test_bad_requests(count: int, available: tuple[int, ...], must: tuple[int, ...], reason: str, text: str) -> None:
    with pytest.raises(AllocationError, match=text) as info:
        preferred_allocation(fixture_topology("hgx_nvswitch"), count, available, must)
    assert info.value.reason == reason


# ----- optimality against brute force on random small topologies ------------------------------------------------

_KINDS = [LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE, LinkKind.SKT, LinkKind.SYS]


@st.composite
def random_topologies(draw: st.DrawFn) -> Topology:
    """Arbitrary (not necessarily tree-shaped) pairwise links, NVLink counts and NIC distances."""
    n = draw(st.integers(min_value=1, max_value=8))
    links: dict[tuple[int, int], Link] = {}
    pcie: dict[tuple[int, int], Link] = {}
    for a in range(n):
        links[(a, a)] = pcie[(a, a)] = Link(LinkKind.SELF)
        for b in range(a + 1, n):
            p = Link(draw(st.sampled_from(_KINDS)))
            nv = draw(st.integers(min_value=0, max_value=18))
            links[(a, b)] = links[(b, a)] = Link(LinkKind.NVLINK, nv) if nv else p
            pcie[(a, b)] = pcie[(b, a)] = p
    nic_count = draw(st.integers(min_value=0, max_value=3))
    from exporter.topology.model import Nic

    loc = PcieLocation("0000:00:00.0", "pci0000:00", (), 0, 0, "")
    nics = tuple(Nic(f"mlx5_{i}", (), loc, "", "", "") for i in range(nic_count))
    nic_links = {(g, nic.name): Link(draw(st.sampled_from(_KINDS))) for g in range(n) for nic in nics}
    gpus = tuple(Gpu(i, f"GPU-{i}", "x", loc, None) for i in range(n))
    return Topology(gpus, nics, links, nic_links, pcie, (0,), (0,), "random", 0.0)


@st.composite
def requests(draw: st.DrawFn) -> tuple[Topology, int, tuple[int, ...], tuple[int, ...]]:
    topo = draw(random_topologies())
    n = len(topo.gpus)
    available = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1))))
    count = draw(st.integers(1, len(available)))
    must = tuple(sorted(draw(st.sets(st.sampled_from(available), max_size=count))))
    return topo, count, available, must


@settings(max_examples=300, deadline=None)
@given(requests())
def test_chosen_set_is_never_farther_apart_than_any_valid_set(
    req: tuple[Topology, int, tuple[int, ...], tuple[int, ...]],
) -> None:
    topo, count, available, must = req
    alloc = preferred_allocation(topo, count, available, must)
    chosen = alloc.gpus
    assert len(chosen) == count
    assert set(must) <= set(chosen) <= set(available)
    assert alloc.exact

    def spread(s: tuple[int, ...]) -> tuple[int, int]:
        pairs = list(itertools.combinations(s, 2))
        return max((topo.link(a, b).cost for a, b in pairs), default=0), sum(topo.link(a, b).cost for a, b in pairs)

    best_key = (*set_key(topo, chosen, available), *chosen)
    for other in itertools.combinations(available, count):
        if not set(must) <= set(other):
            continue
        # the property: never farther apart (worst link first, then total distance)
        assert spread(chosen)[0] <= spread(other)[0]
        assert spread(chosen) <= spread(other)
        # and the search is exact for its whole ranking
        assert best_key <= (*set_key(topo, other, available), *other)


def test_greedy_above_exact_limit_still_valid() -> None:
    n = 20
    loc = PcieLocation("0000:00:00.0", "pci0000:00", (), 0, 0, "")
    links = {
        (a, b): Link(LinkKind.SELF) if a == b else Link(LinkKind.PIX if a // 4 == b // 4 else LinkKind.SYS)
        for a in range(n)
        for b in range(n)
    }
    topo = Topology(
        tuple(Gpu(i, f"GPU-{i}", "x", loc, None) for i in range(n)), (), links, {}, links, (0,), (0,), "t", 0
    )
    alloc = preferred_allocation(topo, 4, (), (9,))
    assert not alloc.exact
    assert alloc.gpus == (8, 9, 10, 11)
    assert alloc.worst_link.kind is LinkKind.PIX
