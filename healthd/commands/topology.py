"""`xpuctl topology`: the node's GPU/NIC matrix like `nvidia-smi topo -m`, or a best-connected card set.

The daemon answers from its cached topology (collected with deadlines off the request path), and this command waits
at most --timeout for the answer, so it never hangs on a stuck driver.
"""

from __future__ import annotations

import argparse

import grpc

from healthd.commands import args as argtypes
from healthd.commands.output import print_json, print_table, wants_json


def cmd_topology(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from exporter.topology.matrix import render_matrix
    from healthd.api.v1 import topology_pb2 as pb
    from healthd.api.v1 import topology_pb2_grpc as pb_grpc
    from healthd.topology.service import topology_from_pb

    stub = pb_grpc.TopologyStub(channel)
    if args.preferred is None:
        reply = stub.Get(pb.GetTopologyRequest(), timeout=args.timeout)
        if wants_json(args):
            print_json(reply)
            return 0
        print(render_matrix(topology_from_pb(reply)), end="")
        return 0
    if args.preferred < 1:
        raise ValueError("--preferred: count must be at least 1")
    choice = stub.PreferredAllocation(
        pb.PreferredAllocationRequest(
            count=args.preferred,
            available=args.available,
            must_include=args.must_include,
            include_faulty_gpus=args.include_faulty_gpus,
        ),
        timeout=args.timeout,
    )
    if wants_json(args):
        print_json(choice)
        return 0
    print(f"GPUs:       {','.join(str(g) for g in choice.gpus)}")
    print(f"UUIDs:      {','.join(choice.uuids)}")
    print(f"worst link: {choice.worst_link}{'' if choice.exact else ' (greedy search)'}")
    if choice.excluded_faulty_gpus:
        print(f"left out:   {','.join(str(g) for g in choice.excluded_faulty_gpus)} (active faults)")
    print("NICs, nearest first:")
    rows = [(nic.name, ",".join(nic.netdevs), nic.link, nic.level, f"GPU{nic.gpu}") for nic in choice.nics]
    print_table(("NIC", "NETDEVS", "LINK", "LEVEL", "NEAREST"), rows)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topology", help="GPU/NIC topology matrix, or the best-connected set of N cards")
    p.add_argument(
        "--preferred", type=argtypes.uint(1024, 1), metavar="N", help="print the best-connected N cards and their NICs"
    )
    p.add_argument(
        "--available",
        type=argtypes.gpu_ids,
        default=[],
        metavar="IDS",
        help="comma-separated GPU indices or UUIDs (default all)",
    )
    p.add_argument("--must-include", type=argtypes.gpu_ids, default=[], metavar="IDS", help="GPUs the set must contain")
    p.add_argument(
        "--include-faulty-gpus", action="store_true", help="also consider cards with faults (left out by default)"
    )
    p.set_defaults(func=cmd_topology)
