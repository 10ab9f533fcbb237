"""Wake asyncio waiters (WatchFaults streams, hook dispatchers) after the engine commits, from any thread.

The journal stays the source of truth: a waiter reads records after its last sequence number and, when there are
none, waits until a commit with a higher one was announced. Announcements only ever follow a commit, so a waiter
that read the journal before a commit and waits afterwards is woken, and none is ever woken for nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib


class CommitSignal:
    def __init__(self, last_seq: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._seq = last_seq
        self._event = asyncio.Event()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the loop the waiters run on; commits announced before are in the journal anyway."""
        self._loop = loop

    @property
    def seq(self) -> int:
        return self._seq

    def notify(self, seq: int) -> None:
        """Thread-safe; the engine calls it after each commit."""
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to wake
            self._loop.call_soon_threadsafe(self._set, seq)

    def _set(self, seq: int) -> None:
        if seq > self._seq:
            self._seq = seq
            self._event.set()
            self._event = asyncio.Event()

    async def wait_beyond(self, seq: int) -> None:
        """Return once a commit with a sequence number above ``seq`` was announced (wrap in asyncio.timeout)."""
        while self._seq <= seq:
            await self._event.wait()
