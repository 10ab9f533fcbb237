"""Requests the HTTP server is answering, so that a long render can step out of their way.

A publish render is tens to hundreds of ms of pure Python under the GIL. A scrape that arrives meanwhile is served
bytes made before, but each handoff between its threads (the selector waking, the worker taking the request,
each write) waits for the render to be forced off the GIL, up to the switch interval each time. The server counts
what it is answering here (``begin``/``end``): from the moment its selector wakes with a socket to read until
that event is handled, and from a request's dispatch until its answer is written. The render calls
``SnapshotRenderer``'s checkpoint between blocks; while the count is above zero the checkpoint waits on ``idle``,
which releases the GIL, so the request's threads run without meeting the render again (exporter/exposition.py
bounds how long one render may wait).
"""

from __future__ import annotations

import threading


class RequestsInFlight:
    """A count of requests being read or answered, and an Event set while it is zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()

    def begin(self) -> None:
        with self._lock:
            self._count += 1
            self._idle.clear()

    def end(self) -> None:
        with self._lock:
            if self._count <= 0:
                raise RuntimeError("end() without begin()")
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    @property
    def busy(self) -> bool:
        """Whether a request is in flight (an attribute read: cheap enough for every block of a render)."""
        return not self._idle.is_set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait, without the GIL, until no request is in flight or ``timeout`` seconds passed; True if idle."""
        return self._idle.wait(timeout)
