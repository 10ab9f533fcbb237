"""xpu_topology_* metrics from the cached topology (a scrape never reads sysfs or the driver)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.snapshot import Snapshot
from exporter.topology.model import LinkKind, Topology
from exporter.topology.refresher import RefreshStatus


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)


class TopologyCollector:
    name = "topology"

    def __init__(self, latest: Callable[[], Topology | None], status: Callable[[], RefreshStatus]) -> None:
        self._latest = latest
        self._status = status

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        topology = self._latest()
        status = self._status()
        up = GaugeMetricFamily("xpu_topology_up", "Whether a topology has been collected (1) or not yet (0).")
        up.add_metric([], 1.0 if topology is not None else 0.0)
        yield up
        failures = CounterMetricFamily(
            "xpu_topology_refresh_failures", "Topology collections that failed or passed their deadline."
        )
        failures.add_metric([], float(status.failures))
        yield failures
        timeouts = CounterMetricFamily(
            "xpu_topology_refresh_timeouts", "Topology collections that passed their deadline."
        )
        timeouts.add_metric([], float(status.timeouts))
        yield timeouts
        if topology is None:
            return
        stamp = GaugeMetricFamily("xpu_topology_collected_timestamp_seconds", "When the topology was collected.")
        stamp.add_metric([], topology.collected_at)
        yield stamp
        warnings = GaugeMetricFamily(
            "xpu_topology_warnings", "Devices or reads the last collection could not place (see Topology.Get)."
        )
        warnings.add_metric([], float(len(topology.warnings)))
        yield warnings
        gpu_info = InfoMetricFamily(
            "xpu_topology_gpu",
            "Where each GPU sits: PCIe switch, host bridge, NUMA node, socket and local CPUs.",
            labels=["gpu", "uuid", "pci_bus_id", "pcie_switch", "host_bridge", "numa_node", "socket", "cpu_affinity"],
        )
        for g in topology.gpus:
            loc = g.location
            gpu_info.add_metric(
                [
                    str(g.index),
                    g.uuid,
                    loc.bdf,
                    loc.pcie_switch,
                    loc.host_bridge,
                    _opt(loc.numa_node),
                    _opt(loc.socket),
                    loc.local_cpus,
                ],
                {},
            )
        yield gpu_info
        nic_info = InfoMetricFamily(
            "xpu_topology_nic",
            "RDMA NICs (physical functions) and where they sit.",
            labels=[
                "nic",
                "netdev",
                "pci_bus_id",
                "model",
                "link_layer",
                "state",
                "pcie_switch",
                "numa_node",
                "socket",
            ],
        )
        for n in topology.nics:
            loc = n.location
            nic_info.add_metric(
                [
                    n.name,
                    ",".join(n.netdevs),
                    loc.bdf,
                    n.model,
                    n.link_layer,
                    n.state,
                    loc.pcie_switch,
                    _opt(loc.numa_node),
                    _opt(loc.socket),
                ],
                {},
            )
        yield nic_info
        links = InfoMetricFamily(
            "xpu_topology_gpu_link",
            "Link kind between two GPUs as nvidia-smi topo -m names it (NV#, PIX, PXB, PHB, NODE, SKT, SYS).",
            labels=["gpu", "peer", "link"],
        )
        nvlinks = GaugeMetricFamily(
            "xpu_topology_gpu_nvlinks",
            "NVLinks between two GPUs (direct, or through NVSwitch).",
            labels=["gpu", "peer"],
        )
        for (a, b), link in sorted(topology.gpu_links.items()):
            if a == b:
                continue
            links.add_metric([str(a), str(b), link.label], {})
            if link.kind is LinkKind.NVLINK:
                nvlinks.add_metric([str(a), str(b)], float(link.nvlinks))
        yield links
        yield nvlinks
        nic_links = InfoMetricFamily(
            "xpu_topology_gpu_nic_link", "Link kind between a GPU and an RDMA NIC.", labels=["gpu", "nic", "link"]
        )
        for (gpu, nic), link in sorted(topology.nic_links.items()):
            nic_links.add_metric([str(gpu), nic, link.label], {})
        yield nic_links
