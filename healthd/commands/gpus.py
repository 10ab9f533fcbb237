"""`xpuctl gpus`: the node's cards, one a line, like `nvidia-smi -L`: index, UUID, PCI bus id, serial, MIG mode and
partition mode.

Identity comes from the daemon's topology (Topology.Get), the two modes from the partition capacity
(Partitions.GetCapacity); a daemon that serves no partitions shows "-" for them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import grpc

from healthd.commands.output import enum_label, print_json, print_table, wants_json

if TYPE_CHECKING:
    from healthd.api.v1 import partitions_pb2


def _capacity(channel: grpc.Channel, timeout: float) -> dict[int, partitions_pb2.CardCapacity]:
    from healthd.api.v1 import partitions_pb2 as pb
    from healthd.api.v1 import partitions_pb2_grpc as pb_grpc

    try:
        reply = pb_grpc.PartitionsStub(channel).GetCapacity(pb.GetCapacityRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        err: Any = exc
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        return {}
    return {c.gpu: c for c in reply.cards}


def cmd_gpus(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as ppb
    from healthd.api.v1 import topology_pb2 as pb
    from healthd.api.v1 import topology_pb2_grpc as pb_grpc

    topology = pb_grpc.TopologyStub(channel).Get(pb.GetTopologyRequest(), timeout=args.timeout)
    capacity = _capacity(channel, args.timeout)
    cards = []
    for g in sorted(topology.gpus, key=lambda g: g.index):
        card = capacity.get(g.index)
        cards.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "pciBusId": g.location.pci_bus_id,
                "serial": g.serial,
                "migMode": ("enabled" if card.hardware_mig_enabled else "disabled") if card else "unknown",
                "partitionMode": enum_label(ppb.PartitionMode.DESCRIPTOR, card.mode) if card else "unknown",
            }
        )
    if wants_json(args):
        print_json({"gpus": cards})
        return 0
    rows = [
        (
            c["index"],
            c["name"],
            c["uuid"],
            c["pciBusId"],
            c["serial"] or "-",
            _word(c["migMode"]),
            _word(c["partitionMode"]),
        )
        for c in cards
    ]
    print_table(("GPU", "NAME", "UUID", "PCI BUS ID", "SERIAL", "MIG", "PARTITIONS"), rows, right=(0,))
    return 0


def _word(value: object) -> str:
    return "-" if value == "unknown" else str(value)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gpus", help="the node's cards: index, UUID, PCI bus id, serial, MIG and partition mode")
    p.add_argument("-L", "--list", action="store_true", help="accepted for nvidia-smi's habit; the output is the same")
    p.set_defaults(func=cmd_gpus)
