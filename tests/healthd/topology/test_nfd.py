"""NFD labels from the fixture boxes, the atomic feature-file writer, and the [topology] config section."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.topology.nfd import FeatureFilePublisher, node_labels, render_feature_file, write_feature_file
from exporter.topology.settings import TopologySettings
from healthd.daemon.config import ConfigError, parse_config
from tests.support.topology_fixtures import fixture_topology

NS = "xpu.feature.node.kubernetes.io"


def test_hgx_labels() -> None:
    labels = node_labels(fixture_topology("hgx_nvswitch"), {"block": "b07", "rack": "r12"})
    assert labels == {
        f"{NS}/gpu.count": "8",
        f"{NS}/gpu.product": "NVIDIA-H200",
        f"{NS}/gpu.nvlink": "nvswitch",
        f"{NS}/gpu.nvlink-domain-size": "8",
        f"{NS}/gpu.numa-nodes": "2",
        f"{NS}/rdma.count": "8",
        f"{NS}/rdma.link-layer": "InfiniBand",
        f"{NS}/rdma.gpu-affinity": "pcie_switch",
        f"{NS}/network.block": "b07",
        f"{NS}/network.rack": "r12",
    }


def test_pcie_box_labels() -> None:
    labels = node_labels(fixture_topology("pcie_switch_8gpu"), {}, "example.com")
    assert labels["example.com/gpu.nvlink"] == "none"
    assert labels["example.com/gpu.nvlink-domain-size"] == "1"
    assert labels["example.com/gpu.numa-nodes"] == "2"
    assert labels["example.com/rdma.link-layer"] == "mixed"
    # GPUs 4-7 have their nearest NIC only in the same NUMA node
    assert labels["example.com/rdma.gpu-affinity"] == "numa_node"


def test_partial_nvlink_domain() -> None:
    peers: dict[int, tuple[str, ...] | None] = dict.fromkeys(range(8), ())
    for a, b in ((0, 1), (2, 3)):
        peers[a] = ("00000000:" + ["04", "03", "08", "07"][a] + ":00.0",)
        peers[b] = ("00000000:" + ["04", "03", "08", "07"][b] + ":00.0",)
    t = fixture_topology("pcie_switch_8gpu", peers)
    labels = node_labels(t, {})
    assert labels[f"{NS}/gpu.nvlink"] == "direct"
    assert labels[f"{NS}/gpu.nvlink-domain-size"] == "2"


def test_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "xpu-runtime-kit"
    assert write_feature_file(path, {"a/b": "1"})
    assert path.read_text() == render_feature_file({"a/b": "1"})
    assert path.read_text().splitlines()[1:] == ["a/b=1"]
    assert not write_feature_file(path, {"a/b": "1"})  # unchanged: no rewrite
    assert write_feature_file(path, {"a/b": "2"})
    assert path.read_text().splitlines()[1:] == ["a/b=2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xpu-runtime-kit"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_publisher_skips_a_node_without_nfd(tmp_path: Path) -> None:
    publisher = FeatureFilePublisher(tmp_path / "missing" / "xpu-runtime-kit", {})
    publisher(fixture_topology("hgx_nvswitch"))
    assert publisher.last_labels is not None
    assert not (tmp_path / "missing").exists()


def test_config_topology_section() -> None:
    cfg = parse_config(
        {
            "host": {"sysfs_root": "/host/sys"},
            "topology": {
                "refresh_seconds": 600,
                "nfd_feature_file": "/etc/nfd/features.d/xpu",
                "network": {"block": "b07", "rack": "r-12", "host": "node17"},
            },
        }
    )
    assert cfg.host.sysfs_root == Path("/host/sys")  # one sysfs for every reader
    assert cfg.topology.refresh_seconds == 600
    assert cfg.topology.network == (("block", "b07"), ("host", "node17"), ("rack", "r-12"))
    assert parse_config({}).topology == TopologySettings()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"bogus": 1}, "topology.bogus: unknown option"),
        ({"sysfs_root": "/host/sys"}, "topology.sysfs_root: unknown option"),
        ({"refresh_seconds": 1}, "topology.refresh_seconds"),
        ({"nfd_feature_file": "relative"}, "topology.nfd_feature_file"),
        ({"nfd_feature_file": "/etc/x/.hidden"}, "topology.nfd_feature_file"),
        ({"label_namespace": "Not A Domain"}, "topology.label_namespace"),
        ({"network": {"Block": "b1"}}, "topology.network.Block"),
        ({"network": {"block": "has space"}}, "topology.network.block"),
        ({"network": {"block": 7}}, "topology.network.block"),
        ({"network": "b07"}, "topology.network"),
        ({"enabled": "yes"}, "topology.enabled"),
    ],
)
def test_config_errors_name_the_option(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"topology": table})
    assert str(info.value).startswith(message)
