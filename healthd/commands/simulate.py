"""`xpuctl simulate ...`: fault injection into a daemon running on the simulated backend.

Injecting and clearing change the node, so they go to the admin socket (--admin-socket, default: the
healthd-admin.sock next to --socket), as partition changes do; listing the kinds is a read on --socket."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import grpc

from healthd.commands import args as argtypes
from healthd.commands.output import print_json, print_table, wants_json


def _params(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def cmd_simulate_inject(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import simulation_pb2 as pb
    from healthd.api.v1 import simulation_pb2_grpc as pb_grpc
    from healthd.commands.partitions import admin_address

    request = pb.InjectFaultRequest(kind=args.kind, gpu=args.gpu, params=_params(args.params))
    with grpc.insecure_channel(admin_address(args)) as admin:
        reply = pb_grpc.SimulationStub(admin).InjectFault(request, timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
    else:
        print(reply.description)
    return 0


def cmd_simulate_clear(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import simulation_pb2 as pb
    from healthd.api.v1 import simulation_pb2_grpc as pb_grpc
    from healthd.commands.partitions import admin_address

    request = pb.ClearFaultsRequest() if args.gpu is None else pb.ClearFaultsRequest(gpu=args.gpu)
    with grpc.insecure_channel(admin_address(args)) as admin:
        reply = pb_grpc.SimulationStub(admin).ClearFaults(request, timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
    else:
        print(reply.description)
    return 0


def cmd_simulate_kinds(args: argparse.Namespace, channel: grpc.Channel) -> int:
    """Each kind with what it does, then one line per parameter: meaning, allowed values, default."""
    from healthd.api.v1 import simulation_pb2 as pb
    from healthd.api.v1 import simulation_pb2_grpc as pb_grpc

    stub = pb_grpc.SimulationStub(channel)
    reply = stub.ListFaultKinds(pb.ListFaultKindsRequest(), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
        return 0
    rows: list[tuple[str, str]] = []
    for kind in reply.kinds:
        rows.append((kind.kind, kind.summary or "-"))
        for p in kind.parameters:
            default = "required" if p.required else f"default {p.default_value or '-'}"
            rows.append((f"  {p.name}=", f"{p.meaning or '-'}; {p.allowed or 'any value'}; {default}"))
    print_table(("KIND / PARAMETER", "WHAT IT DOES / MEANING; ALLOWED VALUES; DEFAULT"), rows)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("simulate", help="fault injection into a daemon running --simulate")
    sim.add_argument(
        "--admin-socket",
        metavar="ADDR",
        help="admin socket for inject and clear (default: env XPU_ADMIN_SOCKET, else healthd-admin.sock next to "
        "--socket)",
    )
    sim_sub = sim.add_subparsers(dest="action", required=True)
    inject = sim_sub.add_parser("inject", help="inject a fault, e.g. `xpuctl simulate inject xid --gpu 3 code=79`")
    inject.add_argument("kind", help="fault kind (see `xpuctl simulate kinds`)")
    inject.add_argument("--gpu", type=argtypes.uint(65535), default=0, help="GPU index (default 0)")
    inject.add_argument("params", nargs="*", metavar="KEY=VALUE", help="fault parameters")
    inject.set_defaults(func=cmd_simulate_inject)
    clear = sim_sub.add_parser("clear", help="clear persistent faults (hangs, lost cards, links down)")
    clear.add_argument("--gpu", type=argtypes.uint(65535), default=None, help="only this GPU (default: all)")
    clear.set_defaults(func=cmd_simulate_clear)
    kinds = sim_sub.add_parser("kinds", help="the fault kinds, what each does, and the meaning of each parameter")
    kinds.set_defaults(func=cmd_simulate_kinds)
