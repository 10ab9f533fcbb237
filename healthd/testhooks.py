"""TEST-ONLY hooks, enabled only when XPU_HEALTHD_TEST_HOOKS=1 is in the daemon's environment.

SIGUSR2 blocks the event loop (a synchronous sleep on the loop thread), standing in for a coroutine that calls
something blocking by mistake. The tests use it to check that the watchdog stops pinging and systemd would
restart the daemon. Nothing here is reachable in a normal run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("testhooks")

ENV_FLAG = "XPU_HEALTHD_TEST_HOOKS"
BLOCK_SECONDS = 3600.0


def install_test_hooks(loop: asyncio.AbstractEventLoop, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get(ENV_FLAG) != "1":
        return False
    log.warning("test hooks enabled: SIGUSR2 blocks the event loop", env=ENV_FLAG)

    def block() -> None:
        log.warning("test hook: blocking the event loop", seconds=BLOCK_SECONDS)
        time.sleep(BLOCK_SECONDS)

    loop.add_signal_handler(signal.SIGUSR2, block)
    return True
