"""`xpuctl alert-webhook serve`: receive Alertmanager webhooks and hand the faults to the replacement hook."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import grpc

from exporter.http import parse_listen_address
from exporter.settings import ConfigError
from healthd.hook.alertmanager import ForwarderFactory, GrpcHookForwarder, make_forwarder, serve
from healthd.logs import configure_logging
from healthd.rpc.transport import HookClientTls, is_tcp, load_pem_files


def grpc_forwarder_factory(tls: HookClientTls | None = None) -> ForwarderFactory | None:
    """The ReplacementHook client used for ``--hook`` (mutual TLS with ``tls`` when the hook is HOST:PORT)."""
    return lambda address: GrpcHookForwarder(address, tls=tls)


def hook_tls(args: argparse.Namespace) -> HookClientTls | None:
    """--hook-tls-* (the flags of [hook] tls_*); checked now, so a bad file is named before serving."""
    if not args.hook or not is_tcp(args.hook):
        return None
    flags = {
        "--hook-tls-ca": args.hook_tls_ca,
        "--hook-tls-cert": args.hook_tls_cert,
        "--hook-tls-key": args.hook_tls_key,
    }
    missing = [flag for flag, path in flags.items() if path is None]
    if missing:
        raise ValueError(f"--hook {args.hook}: a TCP hook is called with mutual TLS; give {', '.join(missing)}")
    try:
        cert, key, ca = load_pem_files(
            args.hook_tls_cert,
            args.hook_tls_key,
            args.hook_tls_ca,
            ("--hook-tls-cert", "--hook-tls-key", "--hook-tls-ca"),
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return HookClientTls(ca=ca, cert_chain=cert, private_key=key, server_name=args.hook_tls_server_name or "")


def cmd_serve(args: argparse.Namespace, channel: grpc.Channel) -> int:
    address = parse_listen_address(args.listen, default_port=9411)
    forwarder = make_forwarder(args.hook, args.spool, grpc_forwarder_factory(hook_tls(args)))
    configure_logging(args.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(address, forwarder, stop)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hook = sub.add_parser("alert-webhook", help="Alertmanager webhook receiver that reports faults to the hook")
    hook_sub = hook.add_subparsers(dest="action", required=True)
    serve_p = hook_sub.add_parser(
        "serve", help="listen for Alertmanager webhooks (POST /alertmanager) and forward alerts with an action"
    )
    serve_p.add_argument("--listen", default="127.0.0.1:9411", metavar="HOST:PORT", help="default %(default)s")
    serve_p.add_argument("--hook", metavar="ADDR", help="ReplacementHook gRPC address, unix:PATH or HOST:PORT")
    serve_p.add_argument("--spool", type=Path, metavar="FILE", help="append faults as JSON lines instead")
    for flag, what in (
        ("--hook-tls-ca", "CA that signed the hook's certificate"),
        ("--hook-tls-cert", "client certificate"),
        ("--hook-tls-key", "client key"),
    ):
        serve_p.add_argument(flag, type=Path, metavar="FILE", help=f"TCP --hook only (required there): {what} (PEM)")
    serve_p.add_argument("--hook-tls-server-name", metavar="NAME", help="name to check in the hook's certificate")
    serve_p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve_p.set_defaults(func=cmd_serve, prints_result=False)  # a server: it logs, it has no result
