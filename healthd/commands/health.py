"""`xpuctl health`: the latest status of every check on every GPU, and the active faults."""

from __future__ import annotations

import argparse

import grpc

from healthd.commands.faults import format_fault


def health_table(checks: list[tuple[str, str, str]]) -> list[str]:
    """Rows of (check, gpu, status) -> a table with one row per check and one column per GPU."""
    names = sorted({c for c, _, _ in checks})
    gpus = sorted({g for _, g, _ in checks}, key=lambda g: (g != "node", int(g) if g.isdigit() else -1, g))
    status = {(c, g): s for c, g, s in checks}
    width = max([5, *(len(n) for n in names)])
    cols = [max(7, len(g) + 4) for g in gpus]
    lines = [
        "CHECK".ljust(width)
        + "  "
        + "".join(("GPU" + g if g != "node" else "NODE").ljust(w) for g, w in zip(gpus, cols, strict=True))
    ]
    for name in names:
        cells = "".join(status.get((name, g), "-").ljust(w) for g, w in zip(gpus, cols, strict=True))
        lines.append(name.ljust(width) + "  " + cells)
    return lines


def cmd_health(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import health_pb2 as pb
    from healthd.api.v1 import health_pb2_grpc as pb_grpc

    stub = pb_grpc.HealthStub(channel)
    reply = stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=args.timeout)
    rows = [(c.check, str(c.gpu.index) if c.HasField("gpu") else "node", c.status) for c in reply.checks]
    if rows:
        print("\n".join(health_table(rows)))
    else:
        print("no check has reported yet")
    print(f"\nactive faults: {len(reply.active_faults)} (journal seq {reply.last_seq})")
    for fault in reply.active_faults:
        print("  " + format_fault(fault))
    return 1 if args.exit_code and reply.active_faults else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    health = sub.add_parser("health", help="node health: checks per GPU and active faults")
    health.add_argument("--exit-code", action="store_true", help="exit 1 when any fault is active")
    health.set_defaults(func=cmd_health)
