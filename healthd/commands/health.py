"""`xpuctl health`: the latest status of every check on every GPU, why each one that is not ok is so, and the
active faults.

XIDs are driver events, not a check run every cycle, so the daemon has no xid check; the ``xid`` row is made here
from the active XID faults (failed for a critical or fatal one, warning for the others, ok for a card with none),
so a card with an active XID 79 never reads ok on every row.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from healthd.commands.faults import fault_table
from healthd.commands.output import print_json, table, wants_json

if TYPE_CHECKING:
    from healthd.api.v1 import health_pb2

# statuses that need no reason; "unsupported" is a fact of the card, not a problem
QUIET = frozenset({"ok", "unsupported"})
XID_CHECK = "xid"


@dataclass(frozen=True, slots=True)
class Row:
    """One check on one GPU (or the node) as the table shows it."""

    check: str
    gpu: str  # an index, or "node"
    status: str
    detail: str


def _gpu_key(gpu: str) -> tuple[bool, int, str]:
    return (gpu == "node", int(gpu) if gpu.isdigit() else -1, gpu)


def xid_rows(gpus: set[str], faults: list[health_pb2.Fault]) -> list[Row]:
    """The xid row: each card's active XID faults, worst first."""
    from healthd.api.v1 import health_pb2 as pb

    by_gpu: dict[str, list[health_pb2.Fault]] = {}
    for f in faults:
        if f.check == XID_CHECK:
            by_gpu.setdefault(str(f.gpu.index) if f.HasField("gpu") else "node", []).append(f)
    rows = []
    for gpu in sorted(gpus | set(by_gpu), key=_gpu_key):
        found = sorted(by_gpu.get(gpu, []), key=lambda f: -f.severity)
        if not found:
            if gpu != "node":
                rows.append(Row(XID_CHECK, gpu, "ok", ""))
            continue
        status = "failed" if found[0].severity >= pb.SEVERITY_CRITICAL else "warning"
        rows.append(Row(XID_CHECK, gpu, status, "; ".join(f"{f.code}: {f.message}" for f in found)))
    return rows


def health_rows(reply: health_pb2.GetNodeHealthResponse) -> list[Row]:
    rows = [Row(c.check, str(c.gpu.index) if c.HasField("gpu") else "node", c.status, c.detail) for c in reply.checks]
    if rows and not any(r.check == XID_CHECK for r in rows):
        rows += xid_rows({r.gpu for r in rows}, list(reply.active_faults))
    return rows


def health_table(rows: list[Row]) -> list[str]:
    """One row per check and one column per GPU (node-wide checks in the NODE column)."""
    names = sorted({r.check for r in rows})
    gpus = sorted({r.gpu for r in rows}, key=_gpu_key)
    status = {(r.check, r.gpu): r.status for r in rows}
    header = ["CHECK", *("NODE" if g == "node" else f"GPU{g}" for g in gpus)]
    return table(header, ([name, *(status.get((name, g), "-") for g in gpus)] for name in names))


def reasons_table(rows: list[Row]) -> list[str]:
    """Why each check that is not ok is so (failed first)."""
    order = {"failed": 0, "warning": 1}
    shown = sorted(
        (r for r in rows if r.status not in QUIET),
        key=lambda r: (order.get(r.status, 2), _gpu_key(r.gpu), r.check),
    )
    if not shown:
        return []
    body = [("node" if r.gpu == "node" else f"GPU{r.gpu}", r.check, r.status, r.detail or "-") for r in shown]
    return table(["WHERE", "CHECK", "STATUS", "REASON"], body)


def cmd_health(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import health_pb2 as pb
    from healthd.api.v1 import health_pb2_grpc as pb_grpc

    stub = pb_grpc.HealthStub(channel)
    reply = stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
        return 1 if args.exit_code and reply.active_faults else 0
    rows = health_rows(reply)
    if rows:
        print("\n".join(health_table(rows)))
        reasons = reasons_table(rows)
        if reasons:
            print("\n" + "\n".join(reasons))
    else:
        print("no check has reported yet")
    print(f"\nactive faults: {len(reply.active_faults)} (journal seq {reply.last_seq})")
    if reply.active_faults:
        print("\n".join(fault_table(list(reply.active_faults))))
    return 1 if args.exit_code and reply.active_faults else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    health = sub.add_parser("health", help="node health: checks per GPU, why any is not ok, and active faults")
    health.add_argument("--exit-code", action="store_true", help="exit 1 when any fault is active")
    health.set_defaults(func=cmd_health)
