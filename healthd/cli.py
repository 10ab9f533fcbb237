"""xpuctl: talk to a running xpu-healthd over its gRPC socket."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from healthd.config import default_grpc_listen

EXIT_USAGE = 2
EXIT_RPC = 1


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address)


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

    stub = pb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]
    reply = stub.InjectFault(
        pb.InjectFaultRequest(kind=args.kind, gpu=args.gpu, params=_params(args.params)), timeout=args.timeout
    )
    print(reply.description)
    return 0


def cmd_simulate_clear(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import simulation_pb2 as pb
    from healthd.api.v1 import simulation_pb2_grpc as pb_grpc

    stub = pb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]
    request = pb.ClearFaultsRequest() if args.gpu is None else pb.ClearFaultsRequest(gpu=args.gpu)
    print(stub.ClearFaults(request, timeout=args.timeout).description)
    return 0


def cmd_simulate_kinds(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import simulation_pb2 as pb
    from healthd.api.v1 import simulation_pb2_grpc as pb_grpc

    stub = pb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]
    for kind in stub.ListFaultKinds(pb.ListFaultKindsRequest(), timeout=args.timeout).kinds:
        print(f"{kind.kind:16} {' '.join(p + '=' for p in kind.params)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpuctl", description="Control a running xpu-healthd.")
    p.add_argument(
        "--socket",
        default=os.environ.get("XPU_SOCKET", default_grpc_listen()),
        metavar="ADDR",
        help="daemon address, unix:PATH or HOST:PORT (default: %(default)s; env XPU_SOCKET)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")
    sub = p.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="fault injection into a daemon running --simulate")
    sim_sub = sim.add_subparsers(dest="action", required=True)
    inject = sim_sub.add_parser("inject", help="inject a fault, e.g. `xpuctl simulate inject xid --gpu 3 code=79`")
    inject.add_argument("kind", help="fault kind (see `xpuctl simulate kinds`)")
    inject.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    inject.add_argument("params", nargs="*", metavar="KEY=VALUE", help="fault parameters")
    inject.set_defaults(func=cmd_simulate_inject)
    clear = sim_sub.add_parser("clear", help="clear persistent faults (hangs, lost cards, links down)")
    clear.add_argument("--gpu", type=int, default=None, help="only this GPU (default: all)")
    clear.set_defaults(func=cmd_simulate_clear)
    kinds = sim_sub.add_parser("kinds", help="list the fault kinds and their parameters")
    kinds.set_defaults(func=cmd_simulate_kinds)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE pairs given after options, e.g. `inject hang --gpu 3 call=sample`
        if not hasattr(args, "params") or not all("=" in e and not e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.params = [*args.params, *extra]
    func: Callable[[argparse.Namespace, grpc.Channel], int] = args.func
    try:
        with _channel(args.socket) as channel:
            return func(args, channel)
    except ValueError as exc:
        print(f"xpuctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as exc:
        err: Any = exc
        code = err.code()
        detail = err.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            detail = f"cannot reach xpu-healthd at {args.socket} ({detail})"
        print(f"xpuctl: {code.name}: {detail}", file=sys.stderr)
        return EXIT_RPC


if __name__ == "__main__":
    raise SystemExit(main())
