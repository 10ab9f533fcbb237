"""Shared helpers: read the committed fixture sysfs trees as the daemon would."""

from __future__ import annotations

import tomllib

from exporter.topology.discover import GpuIdentity, read_topology
from exporter.topology.layout import Layout, parse_layout
from exporter.topology.model import Topology
from exporter.topology.sysfs import Sysfs
from tests.support.paths import TESTS

SYSFS = TESTS / "fixtures" / "sysfs"


def layout(name: str) -> Layout:
    return parse_layout(tomllib.loads((SYSFS / "layouts" / f"{name}.toml").read_text())["topology"])


def identities(name: str) -> list[GpuIdentity]:
    # NVML's form of the bus id: 8-digit domain, upper case
    return [
        GpuIdentity(i, f"GPU-{name[:4]}-{i}", "NVIDIA H200", "0000" + bdf.upper())
        for i, bdf in enumerate(layout(name).gpu_bdfs())
    ]


def fixture_topology(name: str, peers: dict[int, tuple[str, ...] | None] | None = None) -> Topology:
    if peers is None:
        switch = layout(name).nvlink == "nvswitch"
        peers = dict.fromkeys(range(len(identities(name))), ("nvswitch",) * 18 if switch else None)
    return read_topology(Sysfs(SYSFS / name), identities(name), peers, collected_at=1.0)
