"""RDMA NICs from ``<root>/class/infiniband/<dev>``: its ``device`` link is the PCI function, ``device/net/`` holds
the netdev names, ``ports/<n>/{link_layer,state}`` the port. SR-IOV virtual functions (``device/physfn`` exists) are
left out: they share their physical function's place.
"""

from __future__ import annotations

import os
from pathlib import Path

from exporter.topology.model import Nic
from exporter.topology.sysfs import Sysfs, SysfsError, read_text

# Mellanox/NVIDIA PCI device ids of RDMA-capable adapters (physical functions).
_MODELS = {
    ("0x15b3", "0x1017"): "ConnectX-5",
    ("0x15b3", "0x1019"): "ConnectX-5 Ex",
    ("0x15b3", "0x101b"): "ConnectX-6",
    ("0x15b3", "0x101d"): "ConnectX-6 Dx",
    ("0x15b3", "0x101f"): "ConnectX-6 Lx",
    ("0x15b3", "0x1021"): "ConnectX-7",
    ("0x15b3", "0x1023"): "ConnectX-8",
    ("0x15b3", "0xa2d6"): "BlueField-2",
    ("0x15b3", "0xa2dc"): "BlueField-3",
}


def read_nics(sysfs: Sysfs) -> tuple[tuple[Nic, ...], tuple[str, ...]]:
    """The RDMA NICs (physical functions) and warnings for devices that could not be placed."""
    base = sysfs.root / "class" / "infiniband"
    if not base.is_dir():
        return (), ()
    nics: list[Nic] = []
    warnings: list[str] = []
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        device = entry / "device"
        if not device.exists():
            warnings.append(f"RDMA device {entry.name}: no PCI device link")
            continue
        pci = Path(os.path.realpath(device))
        if (pci / "physfn").exists():
            continue
        try:
            location = sysfs.location(pci.name)
        except SysfsError as exc:
            warnings.append(f"RDMA device {entry.name}: {exc}")
            continue
        vendor, dev_id = read_text(pci / "vendor").lower(), read_text(pci / "device").lower()
        net = pci / "net"
        netdevs = tuple(sorted(p.name for p in net.iterdir())) if net.is_dir() else ()
        ports = sorted((entry / "ports").glob("*"), key=lambda p: p.name) if (entry / "ports").is_dir() else []
        first = ports[0] if ports else entry / "ports" / "1"
        state = read_text(first / "state")
        nics.append(
            Nic(
                name=entry.name,
                netdevs=netdevs,
                location=location,
                model=_MODELS.get((vendor, dev_id), f"{vendor[2:]}:{dev_id[2:]}" if vendor else ""),
                link_layer=read_text(first / "link_layer"),
                state=state.partition(":")[2].strip() or state,  # "4: ACTIVE" -> "ACTIVE"
            )
        )
    return tuple(nics), tuple(warnings)
