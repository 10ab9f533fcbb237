"""Node Feature Discovery local feature file: labels a cluster scheduler can use, written atomically.

nfd-worker's ``local`` source reads every file in ``/etc/kubernetes/node-feature-discovery/features.d/`` (one
``key=value`` per line, ``#`` comments) and ignores files whose name starts with a dot, so the file is written as a
dot-file in the same directory and renamed over the old one. The labels are facts of this node; the cluster's
scheduler (Kueue TAS, Volcano, the kube-scheduler) does the placement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from exporter.atomic_file import write_text_atomic
from exporter.topology.model import NIC_LEVELS, LinkKind, Topology

DEFAULT_FEATURE_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/xpu-runtime-kit")
DEFAULT_NAMESPACE = "xpu.feature.node.kubernetes.io"  # sub-namespaces of feature.node.kubernetes.io pass NFD's filter

_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_VALUE.match(value))


def valid_level_name(name: str) -> bool:
    return len(name) <= 40 and bool(_NAME.match(name))


def valid_namespace(namespace: str) -> bool:
    return len(namespace) <= 253 and bool(_NAMESPACE.match(namespace))


def _sanitize(value: str) -> str:
    cleaned = re.sub(r"[^-A-Za-z0-9_.]+", "-", value).strip("-_.")
    return cleaned[:63].rstrip("-_.")


def node_labels(topology: Topology, network: Mapping[str, str], namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """The labels: GPU and NIC counts, NVLink domain, NIC locality, and the operator's network levels."""
    ns = namespace.rstrip("/")
    labels: dict[str, str] = {f"{ns}/gpu.count": str(len(topology.gpus))}
    products = {g.name for g in topology.gpus}
    if len(products) == 1:
        labels[f"{ns}/gpu.product"] = _sanitize(products.pop())
    labels[f"{ns}/gpu.nvlink"] = _nvlink_kind(topology)
    labels[f"{ns}/gpu.nvlink-domain-size"] = str(_largest_nvlink_clique(topology))
    gpu_nodes = {g.location.numa_node for g in topology.gpus if g.location.numa_node is not None}
    labels[f"{ns}/gpu.numa-nodes"] = str(len(gpu_nodes))
    labels[f"{ns}/rdma.count"] = str(len(topology.nics))
    if topology.nics:
        layers = {n.link_layer for n in topology.nics if n.link_layer}
        labels[f"{ns}/rdma.link-layer"] = _sanitize(layers.pop()) if len(layers) == 1 else "mixed"
        if topology.gpus:
            # the locality every card is guaranteed: the worst, over cards, of the nearest NIC
            worst = max(min(topology.nic_links[(g.index, n.name)].kind for n in topology.nics) for g in topology.gpus)
            labels[f"{ns}/rdma.gpu-affinity"] = NIC_LEVELS.get(worst, "unknown")
    for level, value in sorted(network.items()):
        labels[f"{ns}/network.{level}"] = value
    return labels


def _nvlink_kind(topology: Topology) -> str:
    peers = [g.nvlink_peers for g in topology.gpus]
    if any(p is None for p in peers) and not all(p is None for p in peers):
        return "partial"
    if all(p is None or not p for p in peers):
        return "none"
    if all(p and all(x == "nvswitch" for x in p) for p in peers):
        return "nvswitch"
    return "direct"


def _largest_nvlink_clique(topology: Topology) -> int:
    """Most cards that all reach each other over NVLink (exact; at most a few dozen cards)."""
    nodes = [g.index for g in topology.gpus]
    if not nodes:
        return 0
    adj = {a: {b for b in nodes if b != a and topology.link(a, b).kind is LinkKind.NVLINK} for a in nodes}
    best = 1

    def grow(clique: list[int], candidates: set[int]) -> None:
        nonlocal best
        best = max(best, len(clique))
        if len(clique) + len(candidates) <= best:
            return
        for v in sorted(candidates):
            grow([*clique, v], candidates & adj[v])
            candidates = candidates - {v}

    grow([], set(nodes))
    return best


def render_feature_file(labels: Mapping[str, str]) -> str:
    lines = ["# Written by xpu-healthd (xpu-runtime-kit): node topology facts for cluster schedulers."]
    lines += [f"{key}={value}" for key, value in sorted(labels.items())]
    return "\n".join(lines) + "\n"


def write_feature_file(path: Path, labels: Mapping[str, str]) -> bool:
    """Write atomically (dot-file + rename in the same directory); False when the content is already there."""
    text = render_feature_file(labels)
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    write_text_atomic(path, text)
    return True


class FeatureFilePublisher:
    """The refresher's update hook: rewrite the feature file when the labels change.

    The file is written only when its directory exists (nfd-worker installed with its features.d host mount), so a
    node without NFD gets no stray /etc/kubernetes tree.
    """

    def __init__(self, path: Path | None, network: Mapping[str, str], namespace: str = DEFAULT_NAMESPACE) -> None:
        self.path = path
        self._network = dict(network)
        self._namespace = namespace
        self.last_labels: dict[str, str] | None = None

    def __call__(self, topology: Topology) -> None:
        labels = node_labels(topology, self._network, self._namespace)
        self.last_labels = labels
        if self.path is None or not self.path.parent.is_dir():
            return
        write_feature_file(self.path, labels)
