"""Wires process/pod attribution into the daemon: resolver, kubelet log index, pod-resources client, attributor,
and their collectors. Under --simulate the node around the simulated GPUs (proc tree, kubelet log directory,
pod-resources socket) is simulated under the state directory, and the real readers point there."""

from __future__ import annotations

from pathlib import Path

import structlog

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors.base import Collector
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.sampler import Sampler
from exporter.snapshot import Snapshot
from healthd.config import AttributionSettings
from healthd.sim.node import SimulatedNode

log = structlog.get_logger("attribution")


class AttributionStack:
    def __init__(self, settings: AttributionSettings, backend: Backend, sampler: Sampler, state_dir: Path) -> None:
        self.settings = settings
        self.enabled = settings.process_metrics or settings.pod_metrics
        self.sim: SimulatedNode | None = None
        proc_root, logs_root, socket = settings.proc_root, settings.pod_logs_root, settings.kubelet_socket
        if self.enabled and isinstance(backend, SimulatedBackend):
            self.sim = SimulatedNode(backend, state_dir / "sim-node", serve_kubelet=settings.simulate_kubelet)
            proc_root, logs_root = self.sim.proc_root, self.sim.log_root
            if settings.simulate_kubelet:
                socket = self.sim.kubelet.socket_path
        self.kubelet = KubeletPodResources(socket, refresh_interval=settings.refresh_interval_seconds)
        self.attributor = Attributor(ProcResolver(proc_root), pod_index=PodLogIndex(logs_root), kubelet=self.kubelet)
        if self.enabled:
            sampler.subscribe(self._attribute, "attribution")

    def _attribute(self, snapshot: Snapshot) -> None:
        if self.sim is not None:
            self.sim.sync(snapshot)  # first: the new simulated pids exist when the attributor looks
        self.attributor.update(snapshot)

    def collectors(self) -> list[Collector]:
        out: list[Collector] = []
        if self.settings.process_metrics:
            out.append(ProcessCollector(self.attributor.latest, max_per_gpu=self.settings.max_processes_per_gpu))
        if self.settings.pod_metrics:
            out.append(PodCollector(self.attributor.latest))
        return out

    def start(self) -> None:
        if not self.enabled:
            return
        if self.sim is not None:
            self.sim.start()
        self.kubelet.refresh()  # first answer before the first scrape; then in the background
        self.kubelet.start()

    def stop(self) -> None:
        self.kubelet.stop()
        if self.sim is not None:
            self.sim.stop()
