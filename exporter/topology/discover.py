"""Put the topology together: GPUs (identity from the backend, place from sysfs, NVLink peers from the backend),
RDMA NICs from sysfs, and every pairwise link. Pure apart from the sysfs reads; deadlines live in ``refresher.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.topology.infiniband import read_nics
from exporter.topology.model import Gpu, PcieLocation, Topology, build_topology, normalize_bdf
from exporter.topology.sysfs import Sysfs, SysfsError


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str  # as NVML reports it
    serial: str = ""  # the board serial; "" where the card does not report one


def read_topology(
    sysfs: Sysfs,
    gpus: Sequence[GpuIdentity],
    nvlink_peers: Mapping[int, tuple[str, ...] | None],
    *,
    collected_at: float,
) -> Topology:
    """The node's topology. A GPU sysfs does not know keeps its identity with an unknown place (and a warning)."""
    warnings: list[str] = []
    placed: list[Gpu] = []
    for ident in sorted(gpus, key=lambda g: g.index):
        bdf = normalize_bdf(ident.pci_bus_id)
        try:
            location = sysfs.location(bdf)
        except SysfsError as exc:
            warnings.append(f"GPU {ident.index}: {exc}")
            location = PcieLocation(bdf, f"unknown:{bdf}", (), None, None, "")
        peers = nvlink_peers.get(ident.index)
        placed.append(
            Gpu(
                index=ident.index,
                uuid=ident.uuid,
                name=ident.name,
                location=location,
                nvlink_peers=None if peers is None else tuple(_peer(p) for p in peers),
                serial=ident.serial,
            )
        )
    nics, nic_warnings = read_nics(sysfs)
    warnings.extend(nic_warnings)
    return build_topology(
        tuple(placed),
        nics,
        numa_nodes=sysfs.online_nodes(),
        sockets=sysfs.sockets(),
        source=str(sysfs.root),
        collected_at=collected_at,
        warnings=tuple(warnings),
    )


def _peer(peer: str) -> str:
    try:
        return normalize_bdf(peer)
    except ValueError:
        return peer  # NVLINK_SWITCH or another non-PCI marker
