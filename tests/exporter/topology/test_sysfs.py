"""Topology read from the committed fixture sysfs trees, checked against hand-computed matrices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.topology.layout import LayoutError, parse_layout, write_sysfs
from exporter.topology.matrix import render_matrix
from exporter.topology.model import Link, LinkKind, PcieLocation, normalize_bdf, pcie_kind
from exporter.topology.sysfs import Sysfs, SysfsError, parse_cpulist
from tests.support.topology_fixtures import SYSFS, fixture_topology, layout

# Hand-computed from the layout comments (rows: GPUs then NICs; columns: GPUs then NICs).
PCIE_SWITCH_EXPECTED = """
X    PIX  PXB  PXB  SYS  SYS  SYS  SYS  PIX  SYS  SYS
PIX  X    PXB  PXB  SYS  SYS  SYS  SYS  PIX  SYS  SYS
PXB  PXB  X    PIX  SYS  SYS  SYS  SYS  PXB  SYS  SYS
PXB  PXB  PIX  X    SYS  SYS  SYS  SYS  PXB  SYS  SYS
SYS  SYS  SYS  SYS  X    PIX  PHB  PHB  SYS  SKT  NODE
SYS  SYS  SYS  SYS  PIX  X    PHB  PHB  SYS  SKT  NODE
SYS  SYS  SYS  SYS  PHB  PHB  X    PIX  SYS  SKT  NODE
SYS  SYS  SYS  SYS  PHB  PHB  PIX  X    SYS  SKT  NODE
"""

HGX_EXPECTED = """
X    NV18 NV18 NV18 NV18 NV18 NV18 NV18 PIX  PIX  NODE NODE SYS  SYS  SYS  SYS
NV18 X    NV18 NV18 NV18 NV18 NV18 NV18 PIX  PIX  NODE NODE SYS  SYS  SYS  SYS
NV18 NV18 X    NV18 NV18 NV18 NV18 NV18 NODE NODE PIX  PIX  SYS  SYS  SYS  SYS
NV18 NV18 NV18 X    NV18 NV18 NV18 NV18 NODE NODE PIX  PIX  SYS  SYS  SYS  SYS
NV18 NV18 NV18 NV18 X    NV18 NV18 NV18 SYS  SYS  SYS  SYS  PIX  PIX  NODE NODE
NV18 NV18 NV18 NV18 NV18 X    NV18 NV18 SYS  SYS  SYS  SYS  PIX  PIX  NODE NODE
NV18 NV18 NV18 NV18 NV18 NV18 X    NV18 SYS  SYS  SYS  SYS  NODE NODE PIX  PIX
NV18 NV18 NV18 NV18 NV18 NV18 NV18 X    SYS  SYS  SYS  SYS  NODE NODE PIX  PIX
"""


def _grid(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def _labels(name: str) -> list[list[str]]:
    t = fixture_topology(name)
    return [
        [t.link(g.index, o.index).label for o in t.gpus] + [t.nic_links[(g.index, n.name)].label for n in t.nics]
        for g in t.gpus
    ]


@pytest.mark.parametrize(
    ("name", "expected"), [("pcie_switch_8gpu", PCIE_SWITCH_EXPECTED), ("hgx_nvswitch", HGX_EXPECTED)]
)
def test_matrix_matches_hand_computed(name: str, expected: str) -> None:
    assert _labels(name) == _grid(expected)


def test_hgx_affinity_and_nics() -> None:
    t = fixture_topology("hgx_nvswitch")
    assert [n.name for n in t.nics] == [f"mlx5_{i}" for i in range(8)]
    assert t.nics[0].netdevs == ("ibp25s0",)
    assert t.nics[0].model == "ConnectX-7"
    assert t.nics[0].link_layer == "InfiniBand"
    assert t.nics[0].state == "ACTIVE"
    assert [g.location.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.location.socket for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.gpus[5].location.local_cpus == "4-7"
    assert t.gpus[0].location.pcie_switch == "0000:16:00.0"
    assert t.numa_nodes == (0, 1)
    assert t.sockets == (0, 1)
    assert t.warnings == ()


def test_pcie_box_sub_numa_sockets() -> None:
    t = fixture_topology("pcie_switch_8gpu")
    nic1 = next(n for n in t.nics if n.name == "mlx5_1")
    assert (nic1.location.numa_node, nic1.location.socket) == (2, 1)
    assert nic1.link_layer == "Ethernet"
    assert nic1.netdevs == ("ens1f0np0",)
    assert t.sockets == (0, 1)


def test_nvlink_one_link_down_counts_min_of_both_cards() -> None:
    peers: dict[int, tuple[str, ...] | None] = dict.fromkeys(range(8), ("nvswitch",) * 18)
    peers[3] = ("nvswitch",) * 17
    t = fixture_topology("hgx_nvswitch", peers)
    assert t.link(3, 0) == Link(LinkKind.NVLINK, 17)
    assert t.link(0, 1) == Link(LinkKind.NVLINK, 18)


def test_direct_nvlink_peers_by_bus_id() -> None:
    # NVML reports remote PCI bus ids in its own form; two links between GPU0 and GPU1 only.
    peers: dict[int, tuple[str, ...] | None] = dict.fromkeys(range(8))
    peers[0] = ("00000000:04:00.0", "00000000:04:00.0")
    peers[1] = ("00000000:03:00.0", "00000000:03:00.0")
    t = fixture_topology("pcie_switch_8gpu", peers)
    assert t.link(0, 1).label == "NV2"
    assert t.link(0, 2).label == "PXB"


def test_render_matrix_has_header_legend_and_nics() -> None:
    text = render_matrix(fixture_topology("hgx_nvswitch"))
    lines = text.splitlines()
    assert lines[0].split() == [
        *(f"GPU{i}" for i in range(8)),
        *(f"NIC{i}" for i in range(8)),
        "CPU",
        "Affinity",
        "NUMA",
        "Affinity",
        "Socket",
    ]
    assert lines[1].split()[:3] == ["GPU0", "X", "NV18"]
    assert lines[1].split()[-3:] == ["0-3", "0", "0"]
    assert "  NIC0: mlx5_0 (ibp25s0, ConnectX-7, InfiniBand, ACTIVE)" in lines
    assert any(line.strip().startswith("PIX  = ") for line in lines)


def test_committed_fixtures_match_their_layouts(tmp_path: Path) -> None:
    for name in ("pcie_switch_8gpu", "hgx_nvswitch"):
        built = write_sysfs(layout(name), tmp_path / name)
        assert _tree(built) == _tree(SYSFS / name), f"{name}: run python3 tests/fixtures/sysfs/build.py"


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in [*dirnames, *filenames]:
            path = Path(dirpath) / entry
            rel = str(path.relative_to(root))
            out[rel] = "->" + os.readlink(path) if path.is_symlink() else (path.read_text() if path.is_file() else "/")
    return out


def test_missing_device_is_a_warning_not_a_crash() -> None:
    from exporter.topology.discover import GpuIdentity, read_topology

    t = read_topology(
        Sysfs(SYSFS / "hgx_nvswitch"), [GpuIdentity(0, "GPU-x", "x", "00000000:42:00.0")], {}, collected_at=0.0
    )
    assert t.gpus[0].location.numa_node is None
    assert "GPU 0" in t.warnings[0]
    with pytest.raises(SysfsError):
        Sysfs(SYSFS / "hgx_nvswitch").location("0000:42:00.0")


def test_unknown_numa_single_node_system(tmp_path: Path) -> None:
    lay = parse_layout(
        {
            "numa": [{"node": 0, "socket": 0, "cpus": "0-1"}],
            "devices": [{"kind": "gpu", "path": "pci0000:00/0000:00:01.0/0000:01:00.0", "numa_node": 0}],
        }
    )
    write_sysfs(lay, tmp_path)
    (tmp_path / "devices/pci0000:00/0000:00:01.0/0000:01:00.0/numa_node").write_text("-1\n")
    assert Sysfs(tmp_path).location("0000:01:00.0").numa_node == 0  # the only node


def test_unknown_numa_is_conservative() -> None:
    a = PcieLocation("0000:01:00.0", "pci0000:00", (), None, None, "")
    b = PcieLocation("0000:81:00.0", "pci0000:80", (), None, None, "")
    assert pcie_kind(a, b) is LinkKind.SYS


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:18:00.0", "0000:18:00.0"), ("0000:AB:00.0", "0000:ab:00.0"), ("18:00.0", "0000:18:00.0")],
)
def test_normalize_bdf(raw: str, expected: str) -> None:
    assert normalize_bdf(raw) == expected


def test_normalize_bdf_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        normalize_bdf("nvswitch")


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"nvlink": "bogus"}, "topology.nvlink"),
        ({"devices": [{"kind": "fpga"}]}, "topology.devices[0].kind"),
        ({"devices": [{"kind": "gpu", "path": "0000:01:00.0", "numa_node": 0}]}, "topology.devices[0].path"),
        (
            {
                "numa": [{"node": 0, "socket": 0, "cpus": "0"}],
                "devices": [{"kind": "nic", "path": "pci0000:00/0000:01:00.0", "numa_node": 0}],
            },
            "topology.devices[0].name",
        ),
        ({"devices": [{"kind": "gpu", "path": "pci0000:00/0000:01:00.0", "numa_node": 3}]}, "numa_node"),
    ],
)
def test_layout_errors_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_layout(table)
