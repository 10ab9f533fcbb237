"""The render of /metrics from series written straight to it (exporter/collectors/render.py) is byte for byte what
prometheus_client's own encoders write for the same collectors, render after render, while blocks are kept,
rewritten, come and go; and a render reads the Snapshot it is handed."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.collectors.render import SnapshotRenderer
from exporter.collectors.series import GAUGE, Exposer, Family, SeriesCollector
from exporter.encoding import encode_sections
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from exporter.topology.collector import TopologyCollector
from exporter.topology.layout import simulated_sysfs
from exporter.topology.refresher import TopologyRefresher
from healthd.sim.node import SimulatedNode
from tests.support.clock import FakeClock


def _constant() -> float:
    return 0.0  # the collectors' self-timing: the two paths run at different times, so durations must not differ


def reference(snapshot: Snapshot | None, collectors: list[Collector], now: float) -> tuple[bytes, bytes]:
    """prometheus_client's text and OpenMetrics bodies for the collectors over ``snapshot``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, collectors, clock=lambda: now, monotonic=_constant))
    return generate_latest(registry), openmetrics_latest(registry)


def fast(renderer: SnapshotRenderer, snapshot: Snapshot | None) -> tuple[bytes, bytes]:
    sections = renderer.render(snapshot).sections
    return encode_sections(sections, openmetrics=False), encode_sections(sections, openmetrics=True)


@dataclass
class Node:
    backend: SimulatedBackend
    sampler: Sampler
    attributor: Attributor
    refresher: TopologyRefresher
    kubelet: KubeletPodResources
    node: SimulatedNode

    def cycle(self) -> Snapshot:
        snapshot = self.sampler.run_once()
        self.node.sync()
        self.kubelet.refresh()
        self.attributor.update(snapshot)
        return snapshot


@pytest.fixture
def busy(tmp_path: Path, clock: FakeClock) -> Iterator[Node]:
    """h200x8-busy with the daemon's attribution (real proc files, real pod-resources socket) and topology."""
    backend = SimulatedBackend.from_name("h200x8-busy", clock=clock)
    node = SimulatedNode(backend, tmp_path / "node")
    node.kubelet.socket_path = tmp_path / "k.sock"
    sampler = Sampler(backend, SamplerSettings(interval_seconds=5, call_deadline_seconds=5), clock=clock)
    kubelet = KubeletPodResources(node.kubelet.socket_path, refresh_interval=3600, clock=clock)
    attributor = Attributor(ProcResolver(node.proc_root), pod_index=PodLogIndex(node.log_root), kubelet=kubelet)
    sysfs = simulated_sysfs(backend.scenario.extra, [c.pci_bus_id for c in backend.scenario.cards], tmp_path / "s")
    assert sysfs is not None
    guarded = GuardedBackend(DeviceAccess(backend, SamplerSettings(call_deadline_seconds=2.0)))
    refresher = TopologyRefresher(guarded, sampler.latest, sysfs_root=sysfs, clock=clock)
    node.start()
    try:
        yield Node(backend, sampler, attributor, refresher, kubelet, node)
    finally:
        backend.clear()
        kubelet.stop()
        node.stop()
        sampler.stop()


def test_the_daemons_collectors_write_prometheus_clients_bytes_cycle_after_cycle(busy: Node, clock: FakeClock) -> None:
    collectors: list[Collector] = [
        *default_collectors(),
        ProcessCollector(busy.attributor.latest, max_per_gpu=8),  # cards with more: their rest folded
        PodCollector(busy.attributor.latest),
        TopologyCollector(busy.refresher.latest, busy.refresher.status),
        DcgmCompatCollector("node-a", lambda: {3: 79}, attribution=busy.attributor.latest),  # prometheus_client's
    ]
    renderer = SnapshotRenderer(collectors, clock=clock, monotonic=_constant)
    previous: Snapshot | None = None
    for cycle in range(7):
        clock.advance(5)
        if cycle == 2:  # a card stops answering, a process starts, the topology arrives
            busy.backend.inject("hang", 2, {"call": "sample"})
            busy.backend.inject("process_start", 5, {"pid": "4242", "name": 'odd "name"\\'})
            busy.refresher.refresh()
        if cycle == 4:
            busy.backend.clear()
        snapshot = previous if cycle == 5 else busy.cycle()  # cycle 5: the same Snapshot again, every block kept
        previous = snapshot
        text, om = fast(renderer, snapshot)
        assert (text, om) == reference(snapshot, collectors, clock.now), f"cycle {cycle}"
        assert b"xpu_pod_gpu_processes{" in text, f"cycle {cycle}"
        assert b"DCGM_FI_DEV_GPU_TEMP_CELSIUS{" in text, f"cycle {cycle}"  # dcgm-exporter 4.10 names, the default
    assert b"xpu_topology_gpu_nvlinks{" in text


GAUGE_FAMILY = Family("xpu_test_value", "A value.", GAUGE, ("key",))


class Blocks(SeriesCollector):
    """One block per key with the version and value the test sets; records which blocks it wrote."""

    name = "blocks"

    def __init__(self) -> None:
        self.blocks: dict[str, tuple[object, float]] = {}
        self.written: list[Hashable] = []
        self.fail_after: str | None = None

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(GAUGE_FAMILY)
        for key, (version, value) in self.blocks.items():
            rows = out.block(key, version)
            if rows is not None:
                self.written.append(key)
                rows.add(GAUGE_FAMILY, (key,), value)
            if key == self.fail_after:
                raise RuntimeError("a collector bug")


def test_a_block_is_written_only_when_its_version_changes(busy: Node, clock: FakeClock) -> None:
    snapshot = busy.cycle()
    blocks = Blocks()
    renderer = SnapshotRenderer([blocks], clock=clock, monotonic=_constant)
    blocks.blocks = {"a": (1, 1.0), "b": (1, 2.0), "c": (1, 3.0)}
    fast(renderer, snapshot)
    assert blocks.written == ["a", "b", "c"]
    blocks.written.clear()
    blocks.blocks["b"] = (2, 20.0)
    blocks.blocks["a"] = (1, 99.0)  # same version: the collector said nothing it writes from changed
    text, _ = fast(renderer, snapshot)
    assert blocks.written == ["b"]
    assert b'xpu_test_value{key="a"} 1.0\nxpu_test_value{key="b"} 20.0\nxpu_test_value{key="c"} 3.0\n' in text


def test_a_failing_collector_costs_only_its_own_series_and_keeps_its_blocks(busy: Node, clock: FakeClock) -> None:
    snapshot = busy.cycle()
    blocks = Blocks()
    collectors: list[Collector] = [blocks, *default_collectors()]
    renderer = SnapshotRenderer(collectors, clock=clock, monotonic=_constant)
    blocks.blocks = {"a": (1, 1.0), "b": (1, 2.0)}
    fast(renderer, snapshot)
    blocks.blocks["a"] = (2, 10.0)
    blocks.fail_after = "a"
    text, _ = fast(renderer, snapshot)
    assert b'xpu_collector_success{collector="blocks"} 0.0' in text
    assert b'xpu_collector_success{collector="card"} 1.0' in text and b"xpu_gpu_up{" in text
    assert b"xpu_test_value{" not in text, "nothing half-written"
    blocks.fail_after = None
    blocks.written.clear()
    text, om = fast(renderer, snapshot)
    assert blocks.written == ["a"], "the failed render kept nothing; b's block from before it still serves"
    blocks.written.clear()
    assert (text, om) == reference(snapshot, collectors, clock.now)


def test_a_zero_that_changes_sign_is_written_anew(busy: Node, clock: FakeClock) -> None:
    """0.0 == -0.0, yet prometheus_client prints them apart: a kept line must not hide the change."""
    snapshot = busy.cycle()
    blocks = Blocks()
    renderer = SnapshotRenderer([blocks], clock=clock, monotonic=_constant)
    for version, value in enumerate((0.0, -0.0, 0.0)):
        blocks.blocks = {"a": (version, value)}
        text, _ = fast(renderer, snapshot)
        assert f'xpu_test_value{{key="a"}} {value!r}\n'.encode() in text


def test_the_checkpoint_is_called_before_each_collector_and_block_and_changes_nothing(
    busy: Node, clock: FakeClock
) -> None:
    snapshot = busy.cycle()
    blocks, other = Blocks(), Blocks()
    other.name = "other"
    blocks.blocks = {"a": (1, 1.0), "b": (1, 2.0), "c": (1, 3.0)}
    calls: list[list[Hashable]] = []

    def checkpoint() -> None:
        calls.append(list(blocks.written))

    with_checkpoint = SnapshotRenderer([blocks, other], clock=clock, monotonic=_constant)
    sections = with_checkpoint.render(snapshot, checkpoint).sections
    # before the first collector, before each of its 3 blocks, before the second collector (no blocks); nothing
    # after: a written block's lines are kept as they are, joined only by the encoder
    assert calls == [[], [], ["a"], ["a", "b"], ["a", "b", "c"]]
    plain = SnapshotRenderer([blocks, other], clock=clock, monotonic=_constant)
    assert encode_sections(sections, openmetrics=True) == encode_sections(
        plain.render(snapshot).sections, openmetrics=True
    )
