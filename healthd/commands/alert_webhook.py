"""`xpuctl alert-webhook serve`: receive Alertmanager webhooks and hand the faults to the replacement hook."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import grpc

from exporter.http import parse_listen_address
from healthd.alert_webhook import ForwarderFactory, GrpcHookForwarder, make_forwarder, serve
from healthd.logs import configure_logging


def grpc_forwarder_factory() -> ForwarderFactory | None:
    """The ReplacementHook client used for ``--hook``."""
    return GrpcHookForwarder


def cmd_serve(args: argparse.Namespace, channel: grpc.Channel) -> int:
    address = parse_listen_address(args.listen, default_port=9411)
    forwarder = make_forwarder(args.hook, args.spool, grpc_forwarder_factory())
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
    serve_p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve_p.set_defaults(func=cmd_serve)
