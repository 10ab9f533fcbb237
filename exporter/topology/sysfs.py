"""Read where a PCI function sits from sysfs: ``<root>/bus/pci/devices/<bdf>`` is a link into
``<root>/devices/pci<domain>:<bus>/<root port>/.../<bdf>``; the path names the host bridge and every bridge above
the device. NUMA node, CPU affinity and socket come from the device's ``numa_node`` and ``local_cpulist`` and from
``<root>/devices/system/{node,cpu}``. Read-only; every read is a small sysfs file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from exporter.topology.model import PcieLocation

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


class SysfsError(Exception):
    """A device the caller asked for is not where sysfs should have it."""


def read_text(path: Path) -> str:
    """One sysfs attribute, stripped; '' when it does not exist or cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return tuple(cpus)


class Sysfs:
    """sysfs under a configurable root (``/sys`` on a real node, a fixture tree in tests)."""

    def __init__(self, root: Path | str = "/sys") -> None:
        self.root = Path(root)
        self._socket_of_node: dict[int, int | None] = {}

    def pci_device_path(self, bdf: str) -> Path:
        link = self.root / "bus" / "pci" / "devices" / bdf
        if not link.exists():
            raise SysfsError(f"PCI device {bdf} not found under {link.parent}")
        return Path(os.path.realpath(link))

    def location(self, bdf: str) -> PcieLocation:
        real = self.pci_device_path(bdf)
        parts = real.parts
        try:
            start = next(i for i, p in enumerate(parts) if _HOST_BRIDGE.match(p))
        except StopIteration:
            raise SysfsError(f"PCI device {bdf}: no host bridge in its sysfs path {real}") from None
        chain = [p for p in parts[start + 1 :] if _BDF.match(p)]
        if not chain or chain[-1] != bdf:
            raise SysfsError(f"PCI device {bdf}: unexpected sysfs path {real}")
        numa = self.numa_node(real)
        return PcieLocation(
            bdf=bdf,
            host_bridge=parts[start],
            bridges=tuple(chain[:-1]),
            numa_node=numa,
            socket=self.socket_of_node(numa),
            local_cpus=read_text(real / "local_cpulist"),
        )

    def online_nodes(self) -> tuple[int, ...]:
        nodes = self.root / "devices" / "system" / "node"
        found = (
            sorted(int(p.name[4:]) for p in nodes.glob("node[0-9]*") if p.name[4:].isdigit()) if nodes.is_dir() else []
        )
        return tuple(found)

    def numa_node(self, device: Path) -> int | None:
        raw = read_text(device / "numa_node")
        try:
            node = int(raw)
        except ValueError:
            node = -1
        if node >= 0:
            return node
        nodes = self.online_nodes()
        return nodes[0] if len(nodes) == 1 else None  # one node: every device is on it

    def socket_of_node(self, node: int | None) -> int | None:
        if node is None:
            return None
        if node not in self._socket_of_node:
            self._socket_of_node[node] = self._read_socket(node)
        return self._socket_of_node[node]

    def _read_socket(self, node: int) -> int | None:
        cpus = parse_cpulist(read_text(self.root / "devices" / "system" / "node" / f"node{node}" / "cpulist"))
        if not cpus:
            return None
        raw = read_text(self.root / "devices" / "system" / "cpu" / f"cpu{cpus[0]}" / "topology" / "physical_package_id")
        return int(raw) if raw.lstrip("-").isdigit() and int(raw) >= 0 else None

    def sockets(self) -> tuple[int, ...]:
        found = {self.socket_of_node(n) for n in self.online_nodes()}
        return tuple(sorted(s for s in found if s is not None))
