"""Whether the daemon still watches the cards, as a container front end sees it.

Every answer from the daemon (a read that succeeded, a record on the fault stream) is contact. A frozen daemon
keeps its sockets and streams open but answers nothing; a gone one refuses connections. Either way, once
``grace_seconds`` pass without contact the cards are *unmonitored*: nobody would notice a fault on them, so a
front end stops offering them (device plugin: every device Unhealthy, Allocate refused) until the daemon answers
again. The clock is monotonic; wall-clock steps do not matter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unmonitored:
    """Why the cards are not watched now: the daemon has not answered for ``silent_seconds``."""

    silent_seconds: float
    last_error: str

    def message(self) -> str:
        error = f" (last error: {self.last_error})" if self.last_error else ""
        return f"xpu-healthd has not answered for {self.silent_seconds:.0f} s{error}: no card on this node is monitored"


class DaemonLiveness:
    def __init__(self, grace_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_seconds = grace_seconds
        self._clock = clock
        self._last_contact = clock()  # the grace starts at start-up: a daemon that never answers is found too
        self._last_error = ""

    def contact(self) -> None:
        self._last_contact = self._clock()
        self._last_error = ""

    def failed(self, error: str) -> None:
        self._last_error = error

    def silent_for(self) -> float:
        return self._clock() - self._last_contact

    def unmonitored(self) -> Unmonitored | None:
        """None while the daemon answered within the grace period."""
        silent = self.silent_for()
        if silent <= self.grace_seconds:
            return None
        return Unmonitored(silent, self._last_error)
