"""xpu-healthd's command line: read the configuration, check it, and run the daemon (healthd/daemon/) until
signalled. Every start-up failure is one line naming what is wrong, with exit status 2."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from exporter.http import BindError
from exporter.version import VERSION
from healthd.daemon.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config, with_overrides
from healthd.daemon.daemon import Daemon
from healthd.daemon.heap import fix_mmap_threshold, limit_malloc_arenas, settle_heap
from healthd.daemon.instance import claim_node, lock_state_dir
from healthd.daemon.lifecycle import Lifecycle, LoopHook
from healthd.daemon.startup import (
    MOVABLE_STATE,
    OptionNames,
    StartupError,
    check_references,
    check_socket_dirs,
    check_state_dir,
    move_aside_state,
    option_names,
    restrict_state,
)
from healthd.logs import configure_logging
from healthd.state_files import CorruptStateError, StateFileError

log = structlog.get_logger("main")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpu-healthd", description="GPU node daemon: metrics, health, partitions.")
    p.add_argument("--config", type=Path, help=f"TOML config file (e.g. {DEFAULT_CONFIG_PATH})")
    p.add_argument(
        "--simulate",
        nargs="?",
        const="h200x8",
        metavar="SCENARIO",
        help="run on a simulated node: h200x8 (default), h200x8-busy (400 processes in 100 pods), h200x1, "
        "or a scenario file",
    )
    p.add_argument("--metrics-listen", metavar="ADDR", help="HTTP address for /metrics (default :9410)")
    p.add_argument(
        "--grpc-listen", metavar="ADDR", action="append", help="gRPC address, unix:PATH or HOST:PORT (repeatable)"
    )
    p.add_argument("--state-dir", type=Path, metavar="DIR", help="state directory (default /var/lib/xpu-runtime-kit)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--check-config", action="store_true", help="validate the configuration (addresses, scenario) and exit"
    )
    p.add_argument(
        "--move-aside",
        choices=MOVABLE_STATE,
        metavar="{faults,partitions}",
        help="rename a corrupt state file (faults.sqlite or partitions.sqlite) to <file>.corrupt-<time>, say what "
        "that drops, and exit; the daemon must be stopped",
    )
    p.add_argument("--version", action="version", version=f"xpu-healthd {VERSION}")
    return p


def resolve_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    return with_overrides(
        config,
        simulate=args.simulate,
        metrics_listen=args.metrics_listen,
        grpc_listen=tuple(args.grpc_listen) if args.grpc_listen else None,
        state_dir=args.state_dir,
        log_level=args.log_level,
    )


async def run(
    config: Config,
    *,
    allow_fallback: bool,
    reload_config: Callable[[], Config] | None = None,
    loop_hooks: Sequence[LoopHook] = (),
) -> int:
    daemon = Daemon(config, allow_fallback=allow_fallback)  # the backend and host are chosen here, once
    lifecycle = Lifecycle(
        daemon, daemon.notifier, reload_config=reload_config, loop_hooks=loop_hooks, on_ready=settle_heap
    )
    return await lifecycle.serve()


def main(argv: Sequence[str] | None = None, *, loop_hooks: Sequence[LoopHook] = ()) -> int:
    """Every start-up failure is one line on stderr naming the option, file or address, and exit status 2.

    ``loop_hooks`` are called with the running event loop before the daemon starts (tests only)."""
    args = build_parser().parse_args(argv)
    try:
        config = resolve_config(args)
        names = option_names(source=config.source, flags=_flags_given(args))
        if args.move_aside:
            if not config.state_dir.is_dir():
                print(move_aside_state(config.state_dir, args.move_aside, names))  # says there is nothing to move
                return 0
            held = lock_state_dir(config.state_dir, names)  # refused while a daemon runs on the directory
            try:
                print(move_aside_state(config.state_dir, args.move_aside, names))
            finally:
                held.release()
            return 0
        check_references(config, names)
        config.check_transport()
        if args.check_config:
            print(f"configuration OK ({config.source})")
            return 0
        check_state_dir(config.state_dir, names)
        check_socket_dirs(config, names)
        instance = claim_node(config, names)  # before anything is built: a second daemon touches nothing
    except (ConfigError, StartupError, StateFileError) as exc:
        return _startup_failed(str(exc))
    try:
        return _run_locked(args, config, names, loop_hooks)
    finally:
        instance.release()


def _run_locked(args: argparse.Namespace, config: Config, names: OptionNames, loop_hooks: Sequence[LoopHook]) -> int:
    restrict_state(config.state_dir)
    configure_logging(config.log_level)
    limit_malloc_arenas()  # before any thread allocates: see healthd/daemon/heap.py
    fix_mmap_threshold()
    try:
        return asyncio.run(
            run(
                config,
                allow_fallback=args.config is None,
                reload_config=lambda: resolve_config(args),
                loop_hooks=loop_hooks,
            )
        )
    except CorruptStateError as exc:
        again = " ".join([*_location_flags(args), "--move-aside", exc.kind])
        return _startup_failed(f"{exc} To start without it: xpu-healthd {again}, then start the daemon again.")
    except (ConfigError, StartupError, StateFileError) as exc:
        return _startup_failed(str(exc))
    except BindError as exc:
        return _startup_failed(f"{names.metrics_listen}: {exc}")
    except OSError as exc:  # the gRPC listener names its address; anything else the OS refused at start
        return _startup_failed(f"cannot start: {exc}")


def _startup_failed(message: str) -> int:
    print(f"xpu-healthd: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever the message holds
    return 2


def _flags_given(args: argparse.Namespace) -> set[str]:
    flags = {"metrics_listen": args.metrics_listen, "grpc_listen": args.grpc_listen, "state_dir": args.state_dir}
    return {name for name, value in flags.items() if value is not None} | ({"simulate"} if args.simulate else set())


def _location_flags(args: argparse.Namespace) -> list[str]:
    """The flags that say where the state is, to repeat in a recovery command."""
    out = []
    if args.config is not None:
        out += ["--config", str(args.config)]
    if args.state_dir is not None:
        out += ["--state-dir", str(args.state_dir)]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
