"""Hand each new Snapshot to its subscribers without ever waiting for them.

Every subscriber (the probes, attribution, the exposition cache...) gets its own thread and a one-slot mailbox:
publishing puts the Snapshot in every mailbox and returns at once. A subscriber still busy with an older Snapshot
finds only the newest one when it is done; the ones in between are skipped and counted. So a slow probe (a slow
disk under the fault journal, a /proc walk on a busy host) delays nothing but itself, and never the sampler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("bus")

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class SubscriberStats:
    name: str
    delivered: int  # messages handed to the callback
    skipped: int  # messages replaced by a newer one before the callback was free
    failures: int  # callbacks that raised
    last_seconds: float  # how long the last callback took


class _Subscriber(Generic[M]):
    def __init__(self, name: str, callback: Callable[[M], object], clock: Callable[[], float]) -> None:
        self.name = name
        self._callback = callback
        self._clock = clock
        self._cond = threading.Condition()
        self._slot: M | None = None
        self._busy = False
        self._closed = False
        self._delivered = self._skipped = self._failures = 0
        self._last_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=f"sub-{name}", daemon=True)
        self._thread.start()

    def offer(self, message: M) -> None:
        with self._cond:
            if self._slot is not None:
                self._skipped += 1
            self._slot = message
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cond:
            while self._slot is not None or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stats(self) -> SubscriberStats:
        with self._cond:
            return SubscriberStats(self.name, self._delivered, self._skipped, self._failures, self._last_seconds)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._slot is None and not self._closed:
                    self._cond.wait()
                if self._slot is None:
                    return
                message, self._slot = self._slot, None
                self._busy = True
            started = self._clock()
            failed = False
            try:
                self._callback(message)
            except Exception:
                failed = True
                log.exception("snapshot subscriber failed", subscriber=self.name)
            with self._cond:
                self._busy = False
                self._delivered += 1
                self._failures += failed
                self._last_seconds = self._clock() - started
                self._cond.notify_all()


class LatestBus(Generic[M]):
    """Publish-subscribe where each subscriber sees the latest message, on its own thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._subscribers: list[_Subscriber[M]] = []

    def subscribe(self, callback: Callable[[M], object], name: str | None = None) -> None:
        label = name or getattr(callback, "__qualname__", None) or repr(callback)
        with self._lock:
            self._subscribers.append(_Subscriber(label, callback, self._clock))

    def publish(self, message: M) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.offer(message)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Every subscriber has handled the latest message (tests; a graceful stop)."""
        end = time.monotonic() + timeout
        with self._lock:
            subscribers = list(self._subscribers)
        return all(sub.wait_idle(max(0.0, end - time.monotonic())) for sub in subscribers)

    def stats(self) -> list[SubscriberStats]:
        with self._lock:
            return [sub.stats() for sub in self._subscribers]

    def close(self, timeout: float) -> list[str]:
        """Stop the threads after the message in hand; returns the names of subscribers still busy."""
        with self._lock:
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.close()
        end = time.monotonic() + timeout
        return [sub.name for sub in subscribers if not sub.join(max(0.0, end - time.monotonic()))]
