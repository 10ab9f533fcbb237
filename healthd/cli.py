"""xpuctl: talk to a running xpu-healthd over its gRPC socket."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from exporter.version import VERSION
from healthd.commands import alert_webhook, faults, gpus, health, hook, partitions, simulate, topology, web
from healthd.commands.args import Parser, check_positive_seconds
from healthd.commands.output import add_output_options_everywhere
from healthd.rpc.addresses import default_grpc_listen

# adding a command is one line here
COMMANDS = (gpus, simulate, faults, health, hook, partitions, topology, alert_webhook, web)

EXIT_USAGE = 2
EXIT_RPC = 1
EXIT_BROKEN_PIPE = 128 + 13  # as a program killed by SIGPIPE would end (Python ignores the signal)


# The daemon's longest driver deadline (a MIG create/destroy, [sampler] change_deadline_seconds) is 20 s by
# default; a client must wait longer than that plus a margin to see the daemon's UNAVAILABLE that names the card.
DEFAULT_TIMEOUT_SECONDS = 30.0


def _channel(args: argparse.Namespace) -> grpc.Channel:
    """A unix socket as is; TCP only with mutual TLS, as the daemon serves it."""
    address: str = args.socket
    if address.startswith("unix:"):
        return grpc.insecure_channel(address)
    files = {"--tls-ca": args.tls_ca, "--tls-cert": args.tls_cert, "--tls-key": args.tls_key}
    missing = [flag for flag, path in files.items() if not path]
    if missing:
        raise ValueError(f"{address}: TCP connections use mutual TLS; give {', '.join(missing)}")
    pem = {}
    for flag, path in files.items():
        try:
            with open(path, "rb") as f:
                pem[flag] = f.read()
        except OSError as exc:
            raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
    credentials = grpc.ssl_channel_credentials(pem["--tls-ca"], pem["--tls-key"], pem["--tls-cert"])
    return grpc.secure_channel(address, credentials)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="xpuctl", description="Control a running xpu-healthd.")
    p.add_argument("--version", action="version", version=f"xpuctl {VERSION}")
    p.add_argument(
        "--socket",
        default=os.environ.get("XPU_SOCKET", default_grpc_listen()),
        metavar="ADDR",
        help="daemon address, unix:PATH or HOST:PORT (default: %(default)s; env XPU_SOCKET)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT_SECONDS:g}: longer than the daemon's MIG "
        "change deadline, so a hung card is reported by the daemon, naming the card, not by a client timeout)",
    )
    for flag, env, what in (
        ("--tls-ca", "XPU_TLS_CA", "CA that signed the daemon's certificate"),
        ("--tls-cert", "XPU_TLS_CERT", "client certificate"),
        ("--tls-key", "XPU_TLS_KEY", "client key"),
    ):
        p.add_argument(flag, default=os.environ.get(env), metavar="FILE", help=f"TCP only: {what} (PEM; env {env})")
    sub = p.add_subparsers(dest="command", required=True)

    for command in COMMANDS:
        command.register(sub)
    add_output_options_everywhere(p)  # --json and -o on every command that prints a result
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command. A reader that stops early (``xpuctl partitions list | head -1``) ends it quietly."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here at the latest, not in the interpreter's exit
    except BrokenPipeError:
        # nothing more can be written; point stdout at /dev/null so the final flush at exit stays quiet too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # bare `xpuctl`: the commands, as git and kubectl answer
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE pairs given after options, e.g. `inject hang --gpu 3 call=sample`
        if not hasattr(args, "params") or not all("=" in e and not e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.params = [*args.params, *extra]
    func: Callable[[argparse.Namespace, grpc.Channel], int] = args.func
    try:
        check_positive_seconds(args.timeout, "--timeout")
        with _channel(args) as channel:
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
