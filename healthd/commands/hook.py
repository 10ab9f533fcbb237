"""`xpuctl hook serve`: the reference standby-replacement hook (see healthd/hook/reference.py)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shlex
import signal
from pathlib import Path

import grpc

from exporter.settings import ConfigError
from healthd.commands.args import check_positive_seconds
from healthd.commands.output import print_json, wants_json
from healthd.rpc.addresses import check_grpc_address
from healthd.rpc.transport import GrpcTls, is_tcp, load_pem_files
from healthd.state_files import CorruptStateError, StateFileError, move_aside_if_corrupt

DEFAULT_STATE = Path("/var/lib/xpu-runtime-kit/hook.sqlite")


def cmd_hook_serve(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.hook.reference import serve
    from healthd.logs import configure_logging

    try:
        check_grpc_address(args.listen)
    except ValueError as exc:
        raise ValueError(f"--listen: {exc}") from None
    if not args.exec_command.strip():
        raise ValueError("--exec: the command must not be empty")
    check_exec_program(args.exec_command)
    check_positive_seconds(args.command_timeout, "--command-timeout")
    if not (math.isfinite(args.dedup_window) and args.dedup_window >= 0):
        raise ValueError(f"--dedup-window: seconds, 0 or more (0: off), got {args.dedup_window}")
    tls = _server_tls(args)
    configure_logging(args.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            args.listen,
            args.exec_command,
            args.state,
            command_timeout=args.command_timeout,
            stop=stop,
            tls=tls,
            dedup_window=args.dedup_window,
        )

    try:
        asyncio.run(main())
    except CorruptStateError as exc:
        raise ValueError(
            f"{exc} To start with an empty one: xpuctl hook move-aside --state {args.state}, then start the hook again."
        ) from None
    except StateFileError as exc:
        raise ValueError(str(exc)) from None
    return 0


def check_exec_program(command: str) -> None:
    """A command that names its program by path (``./replace-node.sh``) must find it there and be allowed to run it,
    or every fault would fail with exit 127 and be retried for ever; a bare name is left to PATH and the shell."""
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        return  # the shell reports what it cannot parse, on the first fault
    if "/" in program and not os.access(program, os.X_OK):
        why = "is not executable" if os.path.exists(program) else "does not exist"
        raise ValueError(f"--exec: {program} {why}")


def _server_tls(args: argparse.Namespace) -> GrpcTls | None:
    """The mTLS files of a TCP hook, checked now so a bad file is named before anything listens."""
    flags = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tls-client-ca": args.tls_client_ca}
    given = [flag for flag, path in flags.items() if path]
    if not is_tcp(args.listen):
        if given:
            raise ValueError(f"{given[0]}: only for a TCP --listen (a unix socket is plaintext)")
        return None
    missing = [flag for flag, path in flags.items() if not path]
    if missing:
        raise ValueError(f"--listen {args.listen}: a TCP hook uses mutual TLS; give {', '.join(missing)}")
    try:
        cert, key, ca = load_pem_files(
            args.tls_cert, args.tls_key, args.tls_client_ca, ("--tls-cert", "--tls-key", "--tls-client-ca")
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return GrpcTls(cert_chain=cert, private_key=key, client_ca=ca)


def cmd_hook_move_aside(args: argparse.Namespace, channel: grpc.Channel) -> int:
    """Move a corrupt hook state file aside (never a readable one: that would forget work for no reason)."""
    from healthd.hook.reference import ExecutionStore

    path: Path = args.state
    if not path.exists():
        raise ValueError(f"--state {path}: no such file; nothing to move")
    try:
        outcome = move_aside_if_corrupt(path, ExecutionStore)
    except StateFileError as exc:
        raise ValueError(str(exc)) from None
    if outcome is None:
        raise ValueError(f"--state {path}: the file is readable, nothing moved (delete it yourself to start afresh)")
    moved, corruption = outcome
    if wants_json(args):
        print_json({"moved": str(path), "to": str(moved), "lost": corruption.lost})
    else:
        print(f"moved {path} to {moved}. {corruption.lost}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hook = sub.add_parser("hook", help="the reference standby-replacement hook")
    hook_sub = hook.add_subparsers(dest="action", required=True)
    serve = hook_sub.add_parser(
        "serve",
        help="serve ReplacementHook: run CMD once per fault id with the fault as JSON on stdin",
        description="Acknowledges a fault only after CMD exited 0 and the outcome was stored; a failing CMD is "
        "answered UNAVAILABLE so the daemon retries. CMD runs under /bin/sh -c with XPU_FAULT_ID set.",
    )
    serve.add_argument("--listen", required=True, metavar="ADDR", help="unix:/path or HOST:PORT")
    serve.add_argument("--exec", dest="exec_command", required=True, metavar="CMD", help="shell command to run")
    serve.add_argument("--state", type=Path, default=DEFAULT_STATE, help="SQLite file of outcomes")
    serve.add_argument("--command-timeout", type=float, default=300.0, help="seconds before CMD is killed")
    serve.add_argument(
        "--dedup-window",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="a fault of the same node and condition (node and action; the card for a card action) as one whose "
        "command started this recently and succeeded or runs is acknowledged without a run (0: off)",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    for flag, what in (
        ("--tls-cert", "the hook's server certificate"),
        ("--tls-key", "its key"),
        ("--tls-client-ca", "CA that signed the daemons' client certificates"),
    ):
        serve.add_argument(flag, type=Path, metavar="FILE", help=f"TCP --listen only (required there): {what} (PEM)")
    serve.set_defaults(func=cmd_hook_serve, prints_result=False)  # a server: it logs, it has no result
    aside = hook_sub.add_parser(
        "move-aside",
        help="rename a corrupt hook state file to FILE.corrupt-<time> so the hook can start afresh",
        description="Only a file SQLite reports as damaged is moved; the hook must not be running.",
    )
    aside.add_argument("--state", type=Path, default=DEFAULT_STATE, help="SQLite file of outcomes")
    aside.set_defaults(func=cmd_hook_move_aside)
