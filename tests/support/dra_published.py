"""The simulated h200x8 node's ResourceSlices as container/dra/slices.py publishes them, from the daemon's own
answers (Partitions.GetCapacity, Topology.Get) after setting card modes with xpuctl.

The daemon's public API has no driver version, architecture, or MIG placements yet; FACTS carries them, taken
from the simulated card's own table (exporter/scenarios/h200x8.toml, the placements NVML reports on an H200).
"""

from __future__ import annotations

import tomllib
from typing import Any

import grpc
import kubernetes_validate

from container.dra.kubeapi import to_json
from container.dra.slices import NodeFacts, build_pool, node_owner
from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from healthd.api.v1 import topology_pb2 as tpb
from healthd.api.v1 import topology_pb2_grpc as tpb_grpc
from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

NODE = "h200x8"
NODE_UID = "0b6f1c1e-0000-4000-8000-000000000001"
SCENARIO = tomllib.loads((REPO / "exporter/scenarios/h200x8.toml").read_text())
FACTS = NodeFacts(
    driver_version=SCENARIO["node"]["driver_version"],
    architecture="Hopper",
    mig_placements={p["id"]: tuple((s, n) for s, n in p["placements"]) for p in SCENARIO["mig_profiles"]},
    mig_memory_slices=8,
)


def inventory(daemon: DaemonProcess, modes: dict[int, str]) -> tuple[Any, Any]:
    """Set each card's partition mode, then read capacity and topology the way the driver does."""
    for gpu, mode in modes.items():
        done = daemon.xpuctl("partitions", "mode", str(gpu), mode)
        assert done.returncode == 0, done.stderr
    with grpc.insecure_channel(daemon.address) as channel:
        capacity = ppb_grpc.PartitionsStub(channel).GetCapacity(ppb.GetCapacityRequest(), timeout=10)
        topology = tpb_grpc.TopologyStub(channel).Get(tpb.GetTopologyRequest(), timeout=10)
    return capacity, topology


def published(capacity: Any, topology: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The pool's slices as JSON, each checked against the 1.36 and 1.37 schemas (strict)."""
    pool = build_pool(NODE, capacity, topology, FACTS, owner=node_owner(NODE, NODE_UID), **kwargs)
    slices = [to_json(s) for s in pool.slices]
    for s in slices:
        for version in ("1.36", "1.37"):
            kubernetes_validate.validate(s, version, strict=True)
    return slices


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
