"""Topology collection on the simulated h200x8 node: the scenario's HGX layout, deadlines on hung NVLink reads,
the metrics it exports (checked by promtool) and the NFD feature file it writes."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.backends.types import Unsupported
from exporter.collectors import SnapshotExporter
from exporter.sampler import Sampler, SamplerSettings
from exporter.topology.collector import TopologyCollector
from exporter.topology.layout import LayoutError, simulated_sysfs
from exporter.topology.model import Link, LinkKind
from exporter.topology.nfd import FeatureFilePublisher
from exporter.topology.refresher import TopologyRefresher
from exporter.topology.settings import TopologySettings
from tests.support.waiting import eventually


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[SimulatedBackend, Sampler, Path]]:
    backend = SimulatedBackend.from_name("h200x8")
    sampler = Sampler(backend, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0))
    sampler.run_once()
    root = simulated_sysfs(backend.scenario.extra, [c.pci_bus_id for c in backend.scenario.cards], tmp_path / "sys")
    assert root is not None
    yield backend, sampler, root
    backend.clear()
    sampler.stop()


def _guarded(backend: Backend, read_seconds: float = 1.0) -> GuardedBackend:
    return GuardedBackend(DeviceAccess(backend, SamplerSettings(call_deadline_seconds=read_seconds)))


def _refresher(backend: SimulatedBackend, sampler: Sampler, root: Path, **kw: float) -> TopologyRefresher:
    settings = TopologySettings(deadline_seconds=kw.get("deadline", 5.0))
    device = _guarded(backend, kw.get("call", 1.0))
    return TopologyRefresher(device, sampler.latest, settings, sysfs_root=root, clock=lambda: 1000.0)


def test_simulated_h200x8_is_an_hgx_board(node: tuple[SimulatedBackend, Sampler, Path]) -> None:
    backend, sampler, root = node
    refresher = _refresher(backend, sampler, root)
    t = refresher.refresh()
    assert t is not None
    assert {t.link(a.index, b.index) for a in t.gpus for b in t.gpus if a != b} == {Link(LinkKind.NVLINK, 18)}
    assert [n.name for n in t.nics] == [f"mlx5_{i}" for i in range(8)]
    assert [t.nic_links[(g, f"mlx5_{g}")].label for g in range(8)] == ["PIX"] * 8
    assert t.gpus[0].location.local_cpus == "0-47,96-143"
    assert t.gpus[7].location.socket == 1
    assert t.warnings == ()
    assert refresher.latest() is t
    refresher.stop()


def test_link_down_shows_as_nv17(node: tuple[SimulatedBackend, Sampler, Path]) -> None:
    backend, sampler, root = node
    backend.inject("nvlink_down", 2, {"link": "5"})
    t = _refresher(backend, sampler, root).refresh()
    assert t is not None
    assert t.link(2, 0).label == "NV17"
    assert t.link(0, 1).label == "NV18"


def test_hung_nvlink_read_is_bounded_and_not_repeated(node: tuple[SimulatedBackend, Sampler, Path]) -> None:
    backend, sampler, root = node
    backend.inject("hang", 3, {"call": "nvlink_peers"})
    refresher = _refresher(backend, sampler, root)
    t = refresher.refresh()
    assert t is not None
    assert any("GPU 3: nvlink_peers did not return" in w for w in t.warnings)
    assert t.gpus[3].nvlink_peers is None
    assert t.link(3, 2).label == "PIX"  # falls back to what sysfs proves: same PCIe switch
    assert t.link(0, 1).label == "NV18"
    t2 = refresher.refresh()
    assert t2 is not None
    assert any("GPU 3: not answering (nvlink_peers stuck)" in w for w in t2.warnings), t2.warnings
    backend.clear()
    access = refresher._device.access
    assert eventually(lambda: not access.hung(), 5.0), "the lane frees itself once the stuck call returns"
    t3 = refresher.refresh()
    assert t3 is not None
    assert t3.link(3, 2).label == "NV18"
    assert t3.warnings == ()
    refresher.stop()


def test_a_topology_with_a_card_whose_peers_timed_out_is_collected_again_soon(
    node: tuple[SimulatedBackend, Sampler, Path],
) -> None:
    """Not after ``refresh_seconds`` (an hour): until then the card's NVLinks would read as PCIe paths."""
    backend, sampler, root = node
    backend.inject("hang", 3, {"call": "nvlink_peers"})
    device = _guarded(backend, 0.2)
    settings = TopologySettings(deadline_seconds=5.0, refresh_seconds=3600)
    refresher = TopologyRefresher(device, sampler.latest, settings, sysfs_root=root, retry_seconds=0.2)
    refresher.start()
    try:
        assert eventually(lambda: (t := refresher.latest()) is not None and t.unread == (3,), 10.0)
        first = refresher.latest()
        assert first is not None and first.link(3, 4).label != "NV18"
        backend.clear()
        assert eventually(lambda: (t := refresher.latest()) is not None and t.unread == (), 10.0)
        again = refresher.latest()
        assert again is not None and again.link(3, 4).label == "NV18" and again.warnings == ()
    finally:
        refresher.stop()


class _StuckBackend(SimulatedBackend):
    """nvlink_peers blocks until released, ignoring per-card hang injection (to pass the whole deadline)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = threading.Event()

    def nvlink_peers(self, index: int) -> tuple[str, ...] | Unsupported:
        self.release.wait(30)
        return super().nvlink_peers(index)


def test_whole_collection_deadline(tmp_path: Path) -> None:
    from exporter.backends.scenario import load_scenario

    backend = _StuckBackend(load_scenario("h200x8"))
    sampler = Sampler(backend, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0))
    sampler.run_once()
    root = simulated_sysfs(backend.scenario.extra, [c.pci_bus_id for c in backend.scenario.cards], tmp_path / "s")
    assert root is not None
    refresher = _refresher(backend, sampler, root, deadline=0.2, call=10.0)
    assert refresher.refresh() is None
    status = refresher.status()
    assert (status.timeouts, status.failures) == (1, 1)
    assert status.last_error is not None
    assert "timeout" in status.last_error
    backend.release.set()
    refresher.settings = TopologySettings(deadline_seconds=10.0)
    assert refresher.refresh() is not None
    assert refresher.status().last_error is None
    refresher.stop()
    sampler.stop()


def test_no_inventory_yet_is_reported_not_raised(node: tuple[SimulatedBackend, Sampler, Path]) -> None:
    backend, _, root = node
    refresher = TopologyRefresher(_guarded(backend), lambda: None, sysfs_root=root)
    assert refresher.refresh() is None
    assert refresher.status().last_error == "GPU inventory not known yet (no card has answered its inventory call)"


def test_a_card_stuck_since_start_is_left_out_with_a_warning(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_name("h200x8")
    backend.inject("hang", 5, {"call": "device_info"})
    sampler = Sampler(backend, SamplerSettings(interval_seconds=0.5, call_deadline_seconds=0.2))
    sampler.run_once()
    root = simulated_sysfs(backend.scenario.extra, [c.pci_bus_id for c in backend.scenario.cards], tmp_path / "s")
    assert root is not None
    t = _refresher(backend, sampler, root).refresh()
    assert t is not None
    assert [g.index for g in t.gpus] == [0, 1, 2, 3, 4, 6, 7]
    assert "GPU 5: inventory not known yet (driver calls not answered); left out" in t.warnings
    backend.clear()
    sampler.stop()


def test_scenario_layout_must_match_its_gpus(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_name("h200x8")
    with pytest.raises(LayoutError, match="must be the scenario's"):
        simulated_sysfs(backend.scenario.extra, ["00000000:18:00.0"], tmp_path / "s")
    assert simulated_sysfs({}, [], tmp_path / "none") is None


def test_metrics_pass_promtool_and_feature_file_written(
    node: tuple[SimulatedBackend, Sampler, Path], tmp_path: Path
) -> None:
    backend, sampler, root = node
    features = tmp_path / "features.d"
    features.mkdir()
    publisher = FeatureFilePublisher(features / "xpu-runtime-kit", {"block": "b07", "rack": "r12"})
    refresher = TopologyRefresher(_guarded(backend), sampler.latest, sysfs_root=root, on_update=publisher)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler.latest, [TopologyCollector(refresher.latest, refresher.status)]))
    before = generate_latest(registry).decode()
    assert "xpu_topology_up 0.0" in before
    assert "xpu_topology_gpu_info" not in before
    refresher.refresh()
    text = generate_latest(registry).decode()
    assert "xpu_topology_up 1.0" in text
    assert 'xpu_topology_gpu_nvlinks{gpu="0",peer="7"} 18.0' in text
    assert 'xpu_topology_gpu_nic_link_info{gpu="0",link="PIX",nic="mlx5_0"} 1.0' in text
    assert text.count("xpu_topology_gpu_link_info{") == 56
    assert 'xpu_collector_success{collector="topology"} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is not None:
        run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
    lines = (features / "xpu-runtime-kit").read_text().splitlines()
    assert "xpu.feature.node.kubernetes.io/gpu.nvlink=nvswitch" in lines
    assert "xpu.feature.node.kubernetes.io/network.block=b07" in lines
    assert [p.name for p in features.iterdir()] == ["xpu-runtime-kit"]
