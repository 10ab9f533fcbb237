"""The topology model: GPUs and RDMA NICs with their PCIe place, and the link kind between every pair.

Link kinds are ordered by distance like ``nvidia-smi topo -m``: X (self), NV# (NVLink, direct or through NVSwitch),
PIX (at most one PCIe switch), PXB (several PCIe bridges, no host bridge), PHB (same PCIe host bridge / root
complex), NODE (different host bridges in one NUMA node), SKT (different NUMA nodes of one CPU socket, e.g. with
sub-NUMA clustering; nvidia-smi shows these as SYS), SYS (across the inter-socket link).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

NVLINK_SWITCH = "nvswitch"
"""The peer name an NVLink to an NVSwitch carries (see ``Backend.nvlink_peers``)."""


class LinkKind(enum.IntEnum):
    SELF = 0
    NVLINK = 1
    PIX = 2
    PXB = 3
    PHB = 4
    NODE = 5
    SKT = 6
    SYS = 7


_LEVEL_COST = {
    LinkKind.SELF: 0,
    LinkKind.PIX: 100,
    LinkKind.PXB: 200,
    LinkKind.PHB: 300,
    LinkKind.NODE: 400,
    LinkKind.SKT: 500,
    LinkKind.SYS: 600,
}
_MAX_NVLINKS = 63

# Where a NIC sits relative to a GPU, named as the allocation reports it.
NIC_LEVELS = {
    LinkKind.PIX: "pcie_switch",
    LinkKind.PXB: "pcie_switch",
    LinkKind.PHB: "pcie_host_bridge",
    LinkKind.NODE: "numa_node",
    LinkKind.SKT: "socket",
    LinkKind.SYS: "cross_socket",
}

LEGEND = (
    ("X", "self"),
    ("SYS", "traverses PCIe and the SMP interconnect between CPU sockets (e.g. UPI, Infinity Fabric)"),
    ("SKT", "traverses PCIe and the interconnect between NUMA nodes of one socket (nvidia-smi: SYS)"),
    ("NODE", "traverses PCIe and the interconnect between PCIe host bridges within a NUMA node"),
    ("PHB", "traverses PCIe and a PCIe host bridge (typically the CPU)"),
    ("PXB", "traverses multiple PCIe bridges (without traversing the PCIe host bridge)"),
    ("PIX", "traverses at most a single PCIe switch"),
    ("NV#", "a bonded set of # NVLinks (direct, or through NVSwitch: min of both cards' switch links)"),
)


@dataclass(frozen=True, slots=True, order=True)
class Link:
    """The connection between two devices; ``nvlinks`` counts links when ``kind`` is NVLINK."""

    kind: LinkKind
    nvlinks: int = 0

    @property
    def label(self) -> str:
        if self.kind is LinkKind.SELF:
            return "X"
        if self.kind is LinkKind.NVLINK:
            return f"NV{self.nvlinks}"
        return self.kind.name

    @property
    def cost(self) -> int:
        """A distance that is monotone in the link order: more NVLinks cost less, and any NVLink beats PCIe."""
        if self.kind is LinkKind.NVLINK:
            return 1 + _MAX_NVLINKS - min(max(self.nvlinks, 1), _MAX_NVLINKS)
        return _LEVEL_COST[self.kind]


@dataclass(frozen=True, slots=True)
class PcieLocation:
    """Where a PCI function sits: its host bridge, the bridges above it, and its NUMA node and socket."""

    bdf: str  # 0000:18:00.0 (lower case, 4-digit domain, as sysfs names it)
    host_bridge: str  # pci0000:15
    bridges: tuple[str, ...]  # root port first, the device's own parent bridge last
    numa_node: int | None  # None: the platform does not say (numa_node -1)
    socket: int | None
    local_cpus: str  # cpulist, e.g. "0-47,96-143"; "" when unknown

    @property
    def pcie_switch(self) -> str:
        """The bridge right above the device's own downstream port (a switch's upstream port), or ''."""
        return self.bridges[-2] if len(self.bridges) >= 2 else ""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    location: PcieLocation
    nvlink_peers: tuple[str, ...] | None  # remote PCI bus id (sysfs form) or NVLINK_SWITCH per active link
    serial: str = ""  # the board serial, for finding the card in the rack; "" when not reported


@dataclass(frozen=True, slots=True)
class Nic:
    name: str  # mlx5_0
    netdevs: tuple[str, ...]
    location: PcieLocation
    model: str
    link_layer: str  # InfiniBand / Ethernet / "" (first port)
    state: str  # ACTIVE / DOWN / ... (first port)


@dataclass(frozen=True, slots=True)
class Topology:
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    gpu_links: dict[tuple[int, int], Link]  # both (i, j) and (j, i), and (i, i) = X
    nic_links: dict[tuple[int, str], Link]  # (gpu index, nic name)
    pcie_links: dict[tuple[int, int], Link]  # GPU pairs over PCIe only
    numa_nodes: tuple[int, ...]
    sockets: tuple[int, ...]
    source: str  # sysfs root it was read from
    collected_at: float
    warnings: tuple[str, ...] = field(default=())
    # cards whose NVLink peers were not read (hung, timed out, failed, inventory unknown): collected again soon
    unread: tuple[int, ...] = field(default=())

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def link(self, a: int, b: int) -> Link:
        return self.gpu_links[(a, b)]

    def pcie_link(self, a: int, b: int) -> Link:
        """The PCIe-only path between two GPUs (ignoring NVLink)."""
        return self.pcie_links[(a, b)]


def pcie_kind(a: PcieLocation, b: PcieLocation) -> LinkKind:
    """The PCIe link kind between two functions, from their bridge chains, NUMA nodes and sockets."""
    if a.bdf == b.bdf:
        return LinkKind.SELF
    if a.host_bridge != b.host_bridge:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return LinkKind.NODE
        if a.socket is not None and a.socket == b.socket:
            return LinkKind.SKT
        return LinkKind.SYS
    common = 0
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return LinkKind.PHB
    below_a, below_b = len(a.bridges) - common, len(b.bridges) - common
    return LinkKind.PIX if below_a <= 1 and below_b <= 1 else LinkKind.PXB


def nvlink_count(a: Gpu, b: Gpu) -> int:
    """NVLinks between two GPUs: direct links to the peer's bus id, plus switch links (the smaller side's)."""
    if a.nvlink_peers is None or b.nvlink_peers is None:
        return 0
    direct_ab = sum(1 for p in a.nvlink_peers if p == b.location.bdf)
    direct_ba = sum(1 for p in b.nvlink_peers if p == a.location.bdf)
    direct = min(direct_ab, direct_ba) if direct_ab and direct_ba else max(direct_ab, direct_ba)
    switched = min(a.nvlink_peers.count(NVLINK_SWITCH), b.nvlink_peers.count(NVLINK_SWITCH))
    return direct + switched


def gpu_link(a: Gpu, b: Gpu) -> Link:
    if a.index == b.index:
        return Link(LinkKind.SELF)
    count = nvlink_count(a, b)
    if count:
        return Link(LinkKind.NVLINK, count)
    return Link(pcie_kind(a.location, b.location))


def build_topology(
    gpus: tuple[Gpu, ...],
    nics: tuple[Nic, ...],
    *,
    numa_nodes: tuple[int, ...],
    sockets: tuple[int, ...],
    source: str,
    collected_at: float,
    warnings: tuple[str, ...] = (),
) -> Topology:
    gpu_links = {(a.index, b.index): gpu_link(a, b) for a in gpus for b in gpus}
    nic_links = {(g.index, n.name): Link(pcie_kind(g.location, n.location)) for g in gpus for n in nics}
    pcie_links = {(a.index, b.index): Link(pcie_kind(a.location, b.location)) for a in gpus for b in gpus}
    return Topology(
        gpus=gpus,
        nics=nics,
        gpu_links=gpu_links,
        nic_links=nic_links,
        pcie_links=pcie_links,
        numa_nodes=numa_nodes,
        sockets=sockets,
        source=source,
        collected_at=collected_at,
        warnings=warnings,
    )


def normalize_bdf(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` (or any case/width) -> sysfs's ``0000:18:00.0``."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(parts[0], 16)
    bus = int(parts[1], 16)
    dev, _, fn = parts[2].partition(".")
    return f"{domain:04x}:{bus:02x}:{int(dev, 16):02x}.{int(fn, 16)}"
