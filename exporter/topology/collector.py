"""xpu_topology_* metrics from the cached topology (a scrape never reads sysfs or the driver).

The topology changes only when the refresher collects a new one, so its series are one block kept under the
Topology itself: rendered once per collection, not once per Snapshot."""

from __future__ import annotations

from collections.abc import Callable

from exporter.collectors.series import COUNTER, INFO, Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import Snapshot
from exporter.topology.model import LinkKind, Topology
from exporter.topology.refresher import RefreshStatus

UP = Family("xpu_topology_up", "Whether a topology has been collected (1) or not yet (0).")
FAILURES = Family(
    "xpu_topology_refresh_failures", "Topology collections that failed or passed their deadline.", COUNTER
)
TIMEOUTS = Family("xpu_topology_refresh_timeouts", "Topology collections that passed their deadline.", COUNTER)
COLLECTED = Family("xpu_topology_collected_timestamp_seconds", "When the topology was collected.")
WARNINGS = Family("xpu_topology_warnings", "Devices or reads the last collection could not place (see Topology.Get).")
GPU_INFO = Family(
    "xpu_topology_gpu",
    "Where each GPU sits: PCIe switch, host bridge, NUMA node, socket and local CPUs.",
    INFO,
    ("gpu", "uuid", "pci_bus_id", "pcie_switch", "host_bridge", "numa_node", "socket", "cpu_affinity"),
)
NIC_INFO = Family(
    "xpu_topology_nic",
    "RDMA NICs (physical functions) and where they sit.",
    INFO,
    ("nic", "netdev", "pci_bus_id", "model", "link_layer", "state", "pcie_switch", "numa_node", "socket"),
)
GPU_LINK = Family(
    "xpu_topology_gpu_link",
    "Link kind between two GPUs as nvidia-smi topo -m names it (NV#, PIX, PXB, PHB, NODE, SKT, SYS).",
    INFO,
    ("gpu", "peer", "link"),
)
NVLINKS = Family(
    "xpu_topology_gpu_nvlinks", "NVLinks between two GPUs (direct, or through NVSwitch).", labels=("gpu", "peer")
)
NIC_LINK = Family("xpu_topology_gpu_nic_link", "Link kind between a GPU and an RDMA NIC.", INFO, ("gpu", "nic", "link"))


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)


class TopologyCollector(SeriesCollector):
    name = "topology"

    def __init__(self, latest: Callable[[], Topology | None], status: Callable[[], RefreshStatus]) -> None:
        self._latest = latest
        self._status = status

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        topology = self._latest()
        status = self._status()
        out.declare(UP, FAILURES, TIMEOUTS)
        if (rows := out.block("status", (topology is not None, status.failures, status.timeouts))) is not None:
            rows.add(UP, (), 1.0 if topology is not None else 0.0)
            rows.add(FAILURES, (), float(status.failures))
            rows.add(TIMEOUTS, (), float(status.timeouts))
        if topology is None:
            return
        out.declare(COLLECTED, WARNINGS, GPU_INFO, NIC_INFO, GPU_LINK, NVLINKS, NIC_LINK)
        if (rows := out.block("topology", topology)) is not None:
            _topology(rows, topology)


def _topology(rows: Rows, topology: Topology) -> None:
    rows.add(COLLECTED, (), topology.collected_at)
    rows.add(WARNINGS, (), float(len(topology.warnings)))
    for g in topology.gpus:
        loc = g.location
        where = (loc.bdf, loc.pcie_switch, loc.host_bridge, _opt(loc.numa_node), _opt(loc.socket), loc.local_cpus)
        rows.add(GPU_INFO, (str(g.index), g.uuid, *where), 1.0)
    for n in topology.nics:
        loc = n.location
        values = (n.name, ",".join(n.netdevs), loc.bdf, n.model, n.link_layer, n.state, loc.pcie_switch)
        rows.add(NIC_INFO, (*values, _opt(loc.numa_node), _opt(loc.socket)), 1.0)
    for (a, b), link in sorted(topology.gpu_links.items()):
        if a == b:
            continue
        rows.add(GPU_LINK, (str(a), str(b), link.label), 1.0)
        if link.kind is LinkKind.NVLINK:
            rows.add(NVLINKS, (str(a), str(b)), float(link.nvlinks))
    for (gpu, nic), link in sorted(topology.nic_links.items()):
        rows.add(NIC_LINK, (str(gpu), nic, link.label), 1.0)
