"""The attribution component: PID -> cgroup -> container/pod (resolver, kubelet log index, pod-resources client,
attributor) and the process and pod collectors. The paths come from the host view, so on a simulated node the
real readers read the simulated node's files. It answers the node's pod questions (whether kubelet lists a pod,
who holds each device) for the partition owner checks, whatever the metrics settings say."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.collectors.base import Collector
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.executor import in_daemon_thread
from exporter.sampler import Sampler
from exporter.settings import option
from healthd.component import ComponentBase
from healthd.host.view import HostView
from healthd.node import Node

log = structlog.get_logger("attribution")


@dataclass(frozen=True, slots=True)
class AttributionSettings:
    """[attribution]: process and pod metrics (PID -> cgroup -> container/pod, kubelet pod-resources)."""

    process_metrics: bool = True
    pod_metrics: bool = True
    max_processes_per_gpu: int = option(64, min=1, max=10000)
    refresh_interval_seconds: float = option(10.0, min=0.5, max=3600)


class AttributionComponent(ComponentBase):
    name = "attribution"

    def __init__(
        self,
        settings: AttributionSettings,
        host: HostView,
        sampler: Sampler,
        give_way: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.enabled = settings.process_metrics or settings.pod_metrics
        # the pod-resources client serves the partition owners' checks too, whatever the metrics settings say
        self.kubelet = KubeletPodResources(host.kubelet_socket, refresh_interval=settings.refresh_interval_seconds)
        self.attributor = Attributor(
            ProcResolver(host.proc_root),
            pod_index=PodLogIndex(host.pod_logs_root),
            kubelet=self.kubelet,
            checkpoint=give_way,
        )
        if self.enabled:
            sampler.subscribe(self.attributor.update, "attribution")

    def collectors(self) -> Sequence[Collector]:
        out: list[Collector] = []
        if self.settings.process_metrics:
            out.append(ProcessCollector(self.attributor.latest, max_per_gpu=self.settings.max_processes_per_gpu))
        if self.settings.pod_metrics:
            out.append(PodCollector(self.attributor.latest))
        return out

    async def start(self) -> None:
        await in_daemon_thread(self.kubelet.refresh)  # a first answer before the first scrape; then in the background
        self.kubelet.start()

    async def stop(self) -> None:
        await in_daemon_thread(self.kubelet.stop)


def build(node: Node) -> AttributionComponent:
    component = AttributionComponent(
        node.settings(AttributionSettings), node.host, node.sampler, give_way=node.requests.give_way
    )
    node.answer(pods=component.kubelet, attribution=component.attributor.latest)
    return component
