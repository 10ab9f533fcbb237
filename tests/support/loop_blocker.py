"""A daemon for tests whose event loop can be blocked on purpose: SIGUSR2 makes the loop sleep (synchronously).

It stands in for a coroutine that calls something blocking by mistake: the tests use it to check that the watchdog
stops pinging. It is not part of the daemon: it reaches it through the lifecycle's ``loop_hooks`` seam.

    python3 -m tests.support.loop_blocker [xpu-healthd arguments]
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import structlog

from healthd.main import main

log = structlog.get_logger("loop_blocker")

BLOCK_SECONDS = 3600.0


def block_on_sigusr2(loop: asyncio.AbstractEventLoop) -> None:
    def block() -> None:
        log.warning("test hook: blocking the event loop", seconds=BLOCK_SECONDS)
        time.sleep(BLOCK_SECONDS)

    loop.add_signal_handler(signal.SIGUSR2, block)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], loop_hooks=(block_on_sigusr2,)))
