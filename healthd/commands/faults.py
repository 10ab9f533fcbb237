"""`xpuctl faults list|watch|resolve`: the daemon's faults, its fault stream (resumable by sequence number), and
resolving a fault by hand after a repair (admin socket: --admin-socket, default healthd-admin.sock beside --socket).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

import grpc

from healthd.commands import args as argtypes
from healthd.commands.output import enum_label, print_json, table, wants_json
from healthd.findings import Action, Severity

if TYPE_CHECKING:
    from healthd.api.v1 import health_pb2

RECONNECT_MAX_SECONDS = 10.0


def _enum_name(name: str, members: type[Action] | type[Severity], what: str) -> str:
    """``reset_gpu`` -> ``ACTION_RESET_GPU`` (the proto enum value name)."""
    try:
        return f"{members.__name__.upper()}_{members[name.upper()].name}"
    except KeyError:
        choices = ", ".join(m.name.lower() for m in members)
        raise ValueError(f"{what}: expected one of {choices}, got {name!r}") from None


def _gpu(f: health_pb2.Fault) -> str:
    return str(f.gpu.index) if f.HasField("gpu") else "-"


def fault_cells(f: health_pb2.Fault) -> tuple[str, ...]:
    """ID, state, GPU, check/code, severity, action, count, message: the words the JSON uses too."""
    from healthd.api.v1 import health_pb2 as pb

    return (
        f.id,
        enum_label(pb.FaultState.DESCRIPTOR, f.state),
        _gpu(f),
        f"{f.check}/{f.code}",
        enum_label(pb.Severity.DESCRIPTOR, f.severity),
        enum_label(pb.Action.DESCRIPTOR, f.action),
        str(f.count),
        f.message,
    )


FAULT_HEADER = ("ID", "STATE", "GPU", "CHECK/CODE", "SEVERITY", "ACTION", "COUNT", "MESSAGE")


def fault_table(faults: list[health_pb2.Fault]) -> list[str]:
    return table(FAULT_HEADER, (fault_cells(f) for f in faults), right=(2, 6))


def format_fault(f: health_pb2.Fault) -> str:
    """One fault on one line, for a stream (its columns cannot be sized in advance)."""
    fid, state, gpu, code, severity, action, count, message = fault_cells(f)
    return f"{fid}  {state}  gpu={gpu}  {code}  {severity}  action={action}  count={count}  {message}"


def format_record(r: health_pb2.FaultRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.at))
    detail = f"  ({r.detail})" if r.detail else ""
    return f"seq={r.seq} {stamp} {r.kind:9} {format_fault(r.fault)}{detail}"


def cmd_faults_list(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import health_pb2 as pb
    from healthd.api.v1 import health_pb2_grpc as pb_grpc

    if args.limit < 0:
        raise ValueError("--limit: must not be negative")
    request = pb.ListFaultsRequest(
        gpu=args.gpu or "",
        check=args.check or "",
        limit=args.limit,
        state=f"FAULT_STATE_{args.state.upper()}" if args.state else "FAULT_STATE_UNSPECIFIED",
        min_action=_enum_name(args.min_action, Action, "--min-action") if args.min_action else "ACTION_UNSPECIFIED",
        min_severity=_enum_name(args.min_severity, Severity, "--min-severity")
        if args.min_severity
        else "SEVERITY_UNSPECIFIED",
    )
    stub = pb_grpc.HealthStub(channel)
    reply = stub.ListFaults(request, timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
        return 0
    if reply.faults:
        print("\n".join(fault_table(list(reply.faults))))
    else:
        print("no faults", file=sys.stderr)
    return 0


def cmd_faults_watch(args: argparse.Namespace, channel: grpc.Channel) -> int:
    """Print each record; on UNAVAILABLE reconnect with the last seq seen, so nothing is missed or repeated."""
    from healthd.api.v1 import health_pb2 as pb
    from healthd.api.v1 import health_pb2_grpc as pb_grpc

    last = args.after
    delay = 0.5
    while True:
        stub = pb_grpc.HealthStub(channel)
        try:
            for item in stub.WatchFaults(pb.WatchFaultsRequest(after_seq=last), wait_for_ready=True):
                delay = 0.5
                if wants_json(args):
                    print_json(item, one_line=True)  # one object per line, a gap included
                elif item.HasField("gap"):
                    print(f"gap: records {item.gap.from_seq}..{item.gap.to_seq} were removed by retention", flush=True)
                else:
                    print(format_record(item.record), flush=True)
                if item.HasField("gap"):
                    last = item.gap.to_seq
                    continue
                last = item.record.seq
                if args.count and args.count <= item.record.seq - args.after:
                    return 0
            return 0
        except grpc.RpcError as exc:
            err: Any = exc
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            print(f"xpuctl: connection lost ({err.details()}); resuming after seq {last}", file=sys.stderr)
            time.sleep(delay)
            delay = min(RECONNECT_MAX_SECONDS, delay * 2)


def cmd_faults_resolve(args: argparse.Namespace, channel: grpc.Channel) -> int:
    """Resolve one active fault on the admin socket; prints the journal record written."""
    from healthd.api.v1 import health_pb2 as pb
    from healthd.api.v1 import health_pb2_grpc as pb_grpc
    from healthd.commands.partitions import admin_address

    if not args.reason.strip():
        raise ValueError("--reason: say what was repaired")
    with grpc.insecure_channel(admin_address(args)) as admin:
        stub = pb_grpc.HealthStub(admin)
        reply = stub.ResolveFault(pb.ResolveFaultRequest(id=args.id, reason=args.reason), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
    else:
        print(format_record(reply.record))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    faults = sub.add_parser("faults", help="list or watch the daemon's faults")
    faults_sub = faults.add_subparsers(dest="action", required=True)
    lst = faults_sub.add_parser("list", help="faults, oldest change first")
    lst.add_argument("--gpu", type=argtypes.gpu_ref(), help="GPU index or uuid")
    lst.add_argument("--check", help="check name, e.g. xid, ecc")
    lst.add_argument("--state", choices=["active", "resolved"])
    lst.add_argument("--min-action", help="none, restart_app, reset_gpu, reboot_node, replace_node")
    lst.add_argument("--min-severity", help="info, warning, critical, fatal")
    lst.add_argument("--limit", type=argtypes.uint(10000), default=0, help="at most this many (default 1000)")
    lst.set_defaults(func=cmd_faults_list)
    watch = faults_sub.add_parser("watch", help="stream fault records as they happen (Ctrl-C to stop)")
    watch.add_argument(
        "--after", type=argtypes.uint(2**64 - 1), default=0, metavar="SEQ", help="start after this sequence number"
    )
    watch.add_argument(
        "--count", type=argtypes.uint(2**63), default=0, help="exit after this many records (default: never)"
    )
    watch.set_defaults(func=cmd_faults_watch)
    resolve = faults_sub.add_parser("resolve", help="resolve an active fault by hand after a repair (admin socket)")
    resolve.add_argument("id", help="fault id (xpuctl faults list)")
    resolve.add_argument("--reason", required=True, help="what was repaired; journaled with the record")
    resolve.add_argument("--admin-socket", help="admin socket (default: healthd-admin.sock beside --socket)")
    resolve.set_defaults(func=cmd_faults_resolve)


__all__ = ["format_fault", "format_record", "register"]
