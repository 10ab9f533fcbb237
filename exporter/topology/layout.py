"""Write a sysfs tree from a layout description (a ``[topology]`` table): the simulated node's PCIe tree and the
test fixtures. Simulation only: a real node is read from its real /sys.

    [topology]
    nvlink = "nvswitch"            # "nvswitch": every NVLink goes to an NVSwitch; "none": no NVLink
    [[topology.numa]]
    node = 0
    socket = 0
    cpus = "0-47,96-143"
    [[topology.devices]]
    kind = "gpu"                   # or "nic"
    path = "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    numa_node = 0
    name = "mlx5_0"                # nic: RDMA device name; netdev and link_layer optional

Bridges along a path are created once; ``bus/pci/devices/<bdf>`` and ``class/infiniband/<dev>`` are relative
symlinks as on a real system.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.topology.sysfs import parse_cpulist

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
NVLINK_MODES = ("nvswitch", "none")


class LayoutError(ValueError):
    """The layout table is invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class NumaSpec:
    node: int
    socket: int
    cpus: str


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    kind: str
    path: tuple[str, ...]
    numa_node: int
    name: str = ""
    netdev: str = ""
    link_layer: str = "InfiniBand"
    pci_id: tuple[str, str] = ("0x10de", "0x2335")

    @property
    def bdf(self) -> str:
        return self.path[-1]


@dataclass(frozen=True, slots=True)
class Layout:
    nvlink: str
    numa: tuple[NumaSpec, ...]
    devices: tuple[DeviceSpec, ...]

    def gpu_bdfs(self) -> tuple[str, ...]:
        return tuple(d.bdf for d in self.devices if d.kind == "gpu")


def parse_layout(table: Mapping[str, Any], where: str = "topology") -> Layout:
    nvlink = table.get("nvlink", "none")
    if nvlink not in NVLINK_MODES:
        raise LayoutError(f"{where}.nvlink: must be one of {', '.join(NVLINK_MODES)}, got {nvlink!r}")
    numa = []
    for i, raw in enumerate(table.get("numa", [])):
        w = f"{where}.numa[{i}]"
        try:
            numa.append(NumaSpec(int(raw["node"]), int(raw["socket"]), str(raw["cpus"])))
            parse_cpulist(str(raw["cpus"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"{w}: needs node, socket and cpus ({exc})") from None
    nodes = {n.node for n in numa}
    devices = []
    for i, raw in enumerate(table.get("devices", [])):
        w = f"{where}.devices[{i}]"
        kind = raw.get("kind")
        if kind not in ("gpu", "nic"):
            raise LayoutError(f"{w}.kind: must be 'gpu' or 'nic', got {kind!r}")
        path = tuple(str(raw.get("path", "")).lower().split("/"))
        if len(path) < 2 or not _HOST_BRIDGE.match(path[0]) or not all(_BDF.match(p) for p in path[1:]):
            raise LayoutError(f"{w}.path: expected pciDDDD:BB/<bdf>/.../<bdf>, got {raw.get('path')!r}")
        node = raw.get("numa_node")
        if not isinstance(node, int) or node not in nodes:
            raise LayoutError(f"{w}.numa_node: must be one of the [[{where}.numa]] nodes, got {node!r}")
        name = str(raw.get("name", ""))
        if kind == "nic" and not name:
            raise LayoutError(f"{w}.name: a nic needs its RDMA device name (e.g. mlx5_0)")
        pci_id = ("0x10de", "0x2335") if kind == "gpu" else ("0x15b3", "0x1021")
        devices.append(
            DeviceSpec(
                kind=kind,
                path=path,
                numa_node=node,
                name=name,
                netdev=str(raw.get("netdev", "")) or (_ib_netdev(path[-1]) if kind == "nic" else ""),
                link_layer=str(raw.get("link_layer", "InfiniBand")),
                pci_id=(str(raw.get("vendor", pci_id[0])), str(raw.get("device", pci_id[1]))),
            )
        )
    bdfs = [d.bdf for d in devices]
    if len(set(bdfs)) != len(bdfs):
        raise LayoutError(f"{where}.devices: PCI addresses must be unique")
    return Layout(nvlink=nvlink, numa=tuple(numa), devices=tuple(devices))


def _ib_netdev(bdf: str) -> str:
    """The predictable name udev gives an IPoIB netdev: ``ibp<bus>s<slot>`` (decimal)."""
    _, bus, rest = bdf.split(":")
    slot, _, fn = rest.partition(".")
    return f"ibp{int(bus, 16)}s{int(slot, 16)}" + (f"f{fn}" if fn != "0" else "")


def write_sysfs(layout: Layout, root: Path) -> Path:
    """Create the tree under ``root`` (which must not hold another tree); returns ``root``."""
    numa = {n.node: n for n in layout.numa}
    for n in layout.numa:
        node_dir = root / "devices" / "system" / "node" / f"node{n.node}"
        _write(node_dir / "cpulist", n.cpus)
        for cpu in parse_cpulist(n.cpus):
            _write(
                root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id", str(n.socket)
            )
    pci_links = root / "bus" / "pci" / "devices"
    pci_links.mkdir(parents=True, exist_ok=True)
    for dev in layout.devices:
        cpus = numa[dev.numa_node].cpus
        current = root / "devices" / dev.path[0]
        for depth, bdf in enumerate(dev.path[1:], start=1):
            current = current / bdf
            leaf = depth == len(dev.path) - 1
            if leaf:
                vendor, device = dev.pci_id
                klass = "0x030200" if dev.kind == "gpu" else "0x020700"
            else:
                vendor, device, klass = "0x8086", "0x352a", "0x060400"
            if not (current / "class").exists() or leaf:
                _write(current / "vendor", vendor)
                _write(current / "device", device)
                _write(current / "class", klass)
                _write(current / "numa_node", str(dev.numa_node))
                _write(current / "local_cpulist", cpus)
            link = pci_links / bdf
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(current, pci_links))
        if dev.kind == "nic":
            ib = current / "infiniband" / dev.name
            (ib / "device").parent.mkdir(parents=True, exist_ok=True)
            (ib / "device").symlink_to(os.path.relpath(current, ib))
            _write(ib / "ports" / "1" / "link_layer", dev.link_layer)
            _write(ib / "ports" / "1" / "state", "4: ACTIVE")
            _write(current / "net" / dev.netdev / "type", "32" if dev.link_layer == "InfiniBand" else "1")
            cls = root / "class" / "infiniband"
            cls.mkdir(parents=True, exist_ok=True)
            (cls / dev.name).symlink_to(os.path.relpath(ib, cls))
    return root


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def simulated_sysfs(scenario_extra: Mapping[str, Any], gpu_bus_ids: list[str], dest: Path) -> Path | None:
    """For a simulated node: write the scenario's ``[topology]`` tree under ``dest`` (replacing an old one).

    None when the scenario has no ``[topology]``. The scenario's GPUs must be the layout's GPUs, in order.
    """
    import shutil

    from exporter.topology.model import normalize_bdf

    table = scenario_extra.get("topology")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise LayoutError("topology: expected a table")
    layout = parse_layout(table)
    wanted = [normalize_bdf(b) for b in gpu_bus_ids]
    if list(layout.gpu_bdfs()) != wanted:
        raise LayoutError(f"topology.devices: the GPUs {list(layout.gpu_bdfs())} must be the scenario's {wanted}")
    shutil.rmtree(dest, ignore_errors=True)
    return write_sysfs(layout, dest)
