"""The topology component: refresher over the host's sysfs (a simulated tree on a simulated node), the NFD feature
file, the metrics collector and the Topology gRPC service. It answers the node's question which card to use first
(for the partitions' "any" placement)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import grpc

from exporter.backends.guarded import GuardedBackend
from exporter.collectors.base import Collector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler
from exporter.topology.allocation import AllocationError, preferred_allocation
from exporter.topology.collector import TopologyCollector
from exporter.topology.nfd import FeatureFilePublisher
from exporter.topology.refresher import TopologyRefresher
from exporter.topology.settings import TopologySettings
from healthd.component import ComponentBase
from healthd.node import Node
from healthd.rpc.server import Service
from healthd.topology.service import TopologyService

SERVICE_NAME = "xpu.runtime.v1.Topology"


def _add_topology(servicer: TopologyService, server: grpc.aio.Server) -> None:
    from healthd.api.v1 import topology_pb2_grpc

    topology_pb2_grpc.add_TopologyServicer_to_server(servicer, server)


class TopologyComponent(ComponentBase):
    name = "topology"

    def __init__(
        self,
        settings: TopologySettings,
        device: GuardedBackend,
        sampler: Sampler,
        sysfs_root: Path,
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,
    ) -> None:
        self.settings = settings
        self.refresher: TopologyRefresher | None = None
        self._services: list[Service] = []
        self._collectors: list[Collector] = []
        if not settings.enabled:
            return
        publisher = FeatureFilePublisher(
            Path(settings.nfd_feature_file) if settings.nfd_feature_file else None,
            dict(settings.network),
            settings.label_namespace,
        )
        refresher = self.refresher = TopologyRefresher(
            device, sampler.latest, settings, sysfs_root=sysfs_root, on_update=publisher
        )
        self._collectors = [TopologyCollector(refresher.latest, refresher.status)]
        self._services = [
            Service(
                SERVICE_NAME,
                TopologyService(refresher.latest, refresher.status, out_of_service),
                _add_topology,
                ready=lambda: refresher.latest() is not None,
            )
        ]

    def collectors(self) -> Sequence[Collector]:
        return self._collectors

    def services(self) -> Sequence[Service]:
        return self._services

    async def start(self) -> None:
        if self.refresher is not None:
            self.refresher.start()

    async def stop(self) -> None:
        if self.refresher is not None:
            await in_daemon_thread(self.refresher.stop)

    def first_card(self, fitting: Sequence[int]) -> int | None:
        """The card to use first for a one-card request among ``fitting`` (PreferredAllocation with count 1);
        None while no topology is known."""
        topology = self.refresher.latest() if self.refresher is not None else None
        if topology is None:
            return None
        known = {g.index for g in topology.gpus}
        pool = [g for g in fitting if g in known]
        if not pool:
            return None
        try:
            return preferred_allocation(topology, 1, pool).gpus[0]
        except AllocationError:
            return None


def build(node: Node) -> TopologyComponent:
    component = TopologyComponent(
        node.settings(TopologySettings), node.device, node.sampler, node.host.sysfs_root, node.out_of_service
    )
    node.answer(placement=component)
    return component
