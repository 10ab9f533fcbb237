"""xpu-healthd on a simulated node with one card hung from start-up, for end-to-end tests.

The hang is injected into the simulated backend before any component starts, as a card whose driver calls block
from boot would be: every call of that kind on the card waits until the fault is cleared (``xpuctl simulate clear``
over the daemon's Simulation service). It is not part of the daemon: it builds the daemon from the same command
line as healthd.main and runs it under the daemon's own lifecycle (READY, signals, stop).

    python3 -m tests.support.hung_at_start GPU CALL [xpu-healthd arguments]

CALL is what the ``hang`` fault takes: ``*`` for every call, or one call such as ``device_info``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from healthd.daemon.daemon import Daemon
from healthd.daemon.lifecycle import Lifecycle
from healthd.daemon.systemd import Notifier
from healthd.logs import configure_logging
from healthd.main import build_parser, resolve_config


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python3 -m tests.support.hung_at_start GPU CALL [xpu-healthd arguments]", file=sys.stderr)
        return 2
    gpu, call, rest = int(argv[0]), argv[1], argv[2:]
    args = build_parser().parse_args(rest)
    if args.simulate is None:
        print("hung_at_start: needs --simulate (the hang is a simulated fault)", file=sys.stderr)
        return 2
    config = resolve_config(args)
    configure_logging(config.log_level)

    async def serve() -> int:
        daemon = Daemon(config, allow_fallback=args.config is None)
        injector = daemon.backend.injector
        assert injector is not None, "a simulated backend offers fault injection"
        injector.inject("hang", gpu, {"call": call})
        return await Lifecycle(daemon, Notifier(), reload_config=lambda: resolve_config(args)).serve()

    return asyncio.run(serve())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
