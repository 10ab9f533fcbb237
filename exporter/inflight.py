"""Requests the HTTP server is answering, so that a long render can step out of their way.

A publish render is tens to hundreds of ms of pure Python under the GIL. A scrape that arrives meanwhile is served
bytes made before, but each handoff between its threads (the selector waking, the worker taking the request,
each write) waits for the render to be forced off the GIL, up to the switch interval each time. The server counts
what it is answering here (``begin``/``end``): from the moment its selector wakes with a socket to read until
that event is handled, and from a request's dispatch until its answer is written. The render calls
``SnapshotRenderer``'s checkpoint between blocks; while the count is above zero the checkpoint waits on ``idle``,
which releases the GIL, so the request's threads run without meeting the render again (exporter/exposition.py
bounds how long one render may wait).

The rest of the daemon's own cycle does the same through ``give_way``: once per sampling cycle every card's lane
wakes for its call (64 threads queueing for the GIL at 64 cards), then attribution and the probes run their Python,
and a request that comes in that stretch would wait behind all of them at each handoff. Each lane calls
``give_way`` before it takes its next call, attribution before each card and the probe runner before each probe;
it waits for the requests in flight, but never for a request in flight longer than ``BACKGROUND_WAIT_SECONDS``
(a client that stops reading its answer holds its request in flight until the write's deadline), so the fault
path's calls start that much later at most.
"""

from __future__ import annotations

import threading
import time

BACKGROUND_WAIT_SECONDS = 0.025  # the most background work waits for one stretch of requests in flight


class RequestsInFlight:
    """A count of requests being read or answered, and an Event set while it is zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._since = 0.0  # monotonic time the count last went above zero
        self._idle = threading.Event()
        self._idle.set()

    def begin(self) -> None:
        with self._lock:
            if self._count == 0:
                self._since = time.monotonic()
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

    def give_way(self) -> None:
        """Background work's checkpoint: while requests are in flight, wait (without the GIL) until none is, but
        no longer than ``BACKGROUND_WAIT_SECONDS`` after they began to be; returns at once when none is."""
        if self._idle.is_set():
            return
        left = self._since + BACKGROUND_WAIT_SECONDS - time.monotonic()
        if left > 0:
            self.wait_idle(left)
