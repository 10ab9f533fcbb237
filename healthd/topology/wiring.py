"""Build the topology part of the daemon: refresher (with the simulated sysfs tree when simulating), NFD feature
file, metrics collector and gRPC service. Kept out of main.py so the daemon wiring stays a few lines."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors.base import Collector
from exporter.sampler import Sampler
from exporter.topology.allocation import AllocationError, preferred_allocation
from exporter.topology.collector import TopologyCollector
from exporter.topology.layout import simulated_sysfs
from exporter.topology.nfd import FeatureFilePublisher
from exporter.topology.refresher import RefresherConfig, TopologyRefresher
from healthd.config import Config
from healthd.rpc.server import Service
from healthd.topology.service import TopologyService

log = structlog.get_logger("topology")


@dataclass
class TopologyPart:
    refresher: TopologyRefresher | None
    collectors: list[Collector]
    services: list[Service]
    publisher: FeatureFilePublisher | None

    def start(self) -> None:
        if self.refresher is not None:
            self.refresher.start()

    def stop(self) -> None:
        if self.refresher is not None:
            self.refresher.stop()

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


def _add_topology(servicer: object, server: object) -> None:
    from healthd.api.v1 import topology_pb2_grpc

    topology_pb2_grpc.add_TopologyServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def build_topology(
    config: Config,
    device: GuardedBackend,
    sampler: Sampler,
    out_of_service: Callable[[], AbstractSet[int]] = frozenset,
) -> TopologyPart:
    settings = config.topology
    if not settings.enabled:
        return TopologyPart(None, [], [], None)
    sysfs_root = settings.sysfs_root
    backend = device.raw
    if isinstance(backend, SimulatedBackend):
        # simulation only: the scenario's PCIe layout as a sysfs tree, read back by the real code path
        scenario = backend.scenario
        dest = config.state_dir / "simulated-sysfs"
        tree = simulated_sysfs(scenario.extra, [c.pci_bus_id for c in scenario.cards], dest)
        if tree is None:  # no [topology] in the scenario: an empty tree, never the host's /sys with fake GPUs
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            tree = dest
        sysfs_root = tree
        log.info("simulated topology", sysfs_root=str(tree))
    publisher = FeatureFilePublisher(
        Path(settings.nfd_feature_file) if settings.nfd_feature_file else None,
        dict(settings.network),
        settings.label_namespace,
    )
    refresher = TopologyRefresher(
        device,
        sampler.latest,
        RefresherConfig(
            sysfs_root=str(sysfs_root),
            deadline_seconds=settings.deadline_seconds,
            refresh_seconds=settings.refresh_seconds,
        ),
        on_update=publisher,
    )
    return TopologyPart(
        refresher=refresher,
        collectors=[TopologyCollector(refresher.latest, refresher.status)],
        services=[
            Service(
                "xpu.runtime.v1.Topology",
                TopologyService(refresher.latest, refresher.status, out_of_service),
                _add_topology,
            )
        ],
        publisher=publisher,
    )
