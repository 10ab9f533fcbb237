"""The topology component: refresher over the host's sysfs (a simulated tree on a simulated node), the NFD feature
file, the metrics collector and the Topology gRPC service."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import grpc

from exporter.backends.guarded import GuardedBackend
from exporter.collectors.base import Collector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler
from exporter.topology.allocation import AllocationError, preferred_allocation
from exporter.topology.collector import TopologyCollector
from exporter.topology.nfd import FeatureFilePublisher, valid_label_value, valid_level_name, valid_namespace
from exporter.topology.refresher import RefresherConfig, TopologyRefresher
from healthd.rpc.server import Service
from healthd.settings import InvalidKeyError, option
from healthd.topology.service import TopologyService

SERVICE_NAME = "xpu.runtime.v1.Topology"
DEFAULT_NFD_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/xpu-runtime-kit"
DEFAULT_LABEL_NAMESPACE = "xpu.feature.node.kubernetes.io"


def _feature_file(value: str) -> None:
    if value and (not value.startswith("/") or Path(value).name.startswith(".")):
        raise ValueError(f"must be an absolute path to a file not starting with '.', got {value[:200]!r}")


def _namespace(value: str) -> None:
    if not valid_namespace(value):
        raise ValueError(f"not a DNS subdomain: {value[:200]!r}")


def _network(levels: tuple[tuple[str, str], ...]) -> None:
    for level, value in levels:
        if not valid_level_name(level):
            raise InvalidKeyError(level, "level names are lower-case letters, digits and '-'")
        if not value or not valid_label_value(value):
            raise InvalidKeyError(
                level,
                f"expected a label value (1-63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends), got {value[:100]!r}",
            )


@dataclass(frozen=True, slots=True)
class TopologySettings:
    """[topology]: how often the layout is read, the NFD feature file and the operator's network levels."""

    enabled: bool = True
    refresh_seconds: float = option(3600.0, min=10, max=7 * 86400)
    deadline_seconds: float = option(10.0, min=0.1, max=600)
    # Written only when its directory exists (NFD installed); "" disables.
    nfd_feature_file: str = option(DEFAULT_NFD_FEATURE_FILE, check=_feature_file)
    label_namespace: str = option(DEFAULT_LABEL_NAMESPACE, check=_namespace)
    network: tuple[tuple[str, str], ...] = option((), check=_network)  # e.g. [topology.network] block = "b07"


def _add_topology(servicer: TopologyService, server: grpc.aio.Server) -> None:
    from healthd.api.v1 import topology_pb2_grpc

    topology_pb2_grpc.add_TopologyServicer_to_server(servicer, server)


class TopologyComponent:
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
            device,
            sampler.latest,
            RefresherConfig(
                sysfs_root=str(sysfs_root),
                deadline_seconds=settings.deadline_seconds,
                refresh_seconds=settings.refresh_seconds,
            ),
            on_update=publisher,
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
