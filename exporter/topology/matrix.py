"""Render a topology like ``nvidia-smi topo -m``: GPUs and NICs in rows and columns, CPU and NUMA affinity, legend."""

from __future__ import annotations

from exporter.topology.model import LEGEND, Link, LinkKind, Topology, pcie_kind


def render_matrix(topology: Topology) -> str:
    gpu_names = [f"GPU{g.index}" for g in topology.gpus]
    nic_names = [f"NIC{i}" for i in range(len(topology.nics))]
    header = ["", *gpu_names, *nic_names, "CPU Affinity", "NUMA Affinity", "Socket"]
    rows: list[list[str]] = [header]
    for g in topology.gpus:
        cells = [f"GPU{g.index}"]
        cells += [topology.link(g.index, other.index).label for other in topology.gpus]
        cells += [topology.nic_links[(g.index, n.name)].label for n in topology.nics]
        cells += [g.location.local_cpus or "N/A", _opt(g.location.numa_node), _opt(g.location.socket)]
        rows.append(cells)
    for i, n in enumerate(topology.nics):
        cells = [f"NIC{i}"]
        cells += [topology.nic_links[(g.index, n.name)].label for g in topology.gpus]
        cells += [Link(pcie_kind(n.location, m.location)).label for m in topology.nics]
        cells += [n.location.local_cpus or "N/A", _opt(n.location.numa_node), _opt(n.location.socket)]
        rows.append(cells)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip() for row in rows]
    lines.append("")
    lines.append("Legend:")
    lines.append("")
    lines.extend(f"  {key:<4} = {text}" for key, text in LEGEND)
    if topology.nics:
        lines.append("")
        lines.append("NIC Legend:")
        lines.append("")
        for i, n in enumerate(topology.nics):
            extra = ", ".join(x for x in (",".join(n.netdevs), n.model, n.link_layer, n.state) if x)
            lines.append(f"  NIC{i}: {n.name} ({extra})" if extra else f"  NIC{i}: {n.name}")
    if topology.warnings:
        lines.append("")
        lines.extend(f"warning: {w}" for w in topology.warnings)
    return "\n".join(lines) + "\n"


def _opt(value: int | None) -> str:
    return "N/A" if value is None else str(value)


__all__ = ["LinkKind", "render_matrix"]
