"""Supervised worker threads: a long-lived loop that raises is logged, counted, shown, and started again.

A worker thread that dies takes its job with it until the daemon restarts (an XID event loop that stops on one
failed journal write drops every later XID, silently). So every long-lived loop runs under :class:`Workers`:

- an exception out of the loop is logged with its traceback and counted per worker
  (``xpu_worker_restarts_total``);
- the node status is degraded while a worker has failed within the last ``degraded_seconds`` (/healthz, the
  systemd STATUS line and the status page name it and its last error);
- the loop is started again after a back-off that doubles with each failure in a row (``backoff_seconds`` up to
  ``max_backoff_seconds``) and starts over once the loop has run longer than the longest back-off;
- a loop that returns while the worker is not stopping counts as a failure too.

A loop body takes no arguments and returns only when its stop event is set; it may keep what it was working on in
its owner, so the restarted loop picks it up (the XID watcher retries the event it could not record).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
from prometheus_client.core import CounterMetricFamily, Metric

from exporter.snapshot import Snapshot

log = structlog.get_logger("workers")


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """The latest failure of one worker."""

    worker: str
    error: str  # exception class and message, one line
    at: float  # monotonic time of the failure
    restarts: int  # failures since the daemon started (each one restarted the loop)

    def describe(self, now: float) -> str:
        return f"{self.worker} restarted {self.restarts}x, last {now - self.at:.0f}s ago ({self.error[:120]})"


class Workers:
    """The long-lived worker threads of one daemon, each one supervised. Thread-safe."""

    def __init__(
        self,
        *,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 30.0,
        degraded_seconds: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._degraded = degraded_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._failures: dict[str, WorkerFailure] = {}
        self._names: set[str] = set()

    def start(self, name: str, loop: Callable[[], None], stop: threading.Event) -> threading.Thread:
        """Run ``loop`` on a daemon thread named ``name`` until ``stop`` is set, restarting it when it raises."""
        with self._lock:
            self._names.add(name)
        thread = threading.Thread(target=self._supervise, args=(name, loop, stop), name=name, daemon=True)
        thread.start()
        return thread

    def _supervise(self, name: str, loop: Callable[[], None], stop: threading.Event) -> None:
        in_a_row = 0
        while not stop.is_set():
            began = self._monotonic()
            try:
                loop()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                log.exception("worker failed; restarting it", worker=name)
            else:
                if stop.is_set():
                    return
                error = "the loop returned while the worker was not stopping"
                log.error("worker loop returned; restarting it", worker=name)
            now = self._monotonic()
            in_a_row = 1 if now - began > self._max_backoff else in_a_row + 1
            with self._lock:
                previous = self._failures.get(name)
                self._failures[name] = WorkerFailure(name, error, now, (previous.restarts if previous else 0) + 1)
            stop.wait(min(self._max_backoff, self._backoff * 2 ** (in_a_row - 1)))

    def restarts(self) -> dict[str, int]:
        """Failures (each followed by a restart) per worker started so far; 0 for those that never failed."""
        with self._lock:
            return {n: (f.restarts if (f := self._failures.get(n)) else 0) for n in sorted(self._names)}

    def failing(self) -> tuple[WorkerFailure, ...]:
        """Workers that failed within the last ``degraded_seconds``: the node is degraded while there are any."""
        now = self._monotonic()
        with self._lock:
            return tuple(f for f in self._failures.values() if now - f.at < self._degraded)

    def now(self) -> float:
        return self._monotonic()


class WorkersCollector:
    """``xpu_worker_restarts_total{worker}``: how often each supervised worker failed and was started again."""

    name = "workers"

    def __init__(self, workers: Workers) -> None:
        self._workers = workers

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "xpu_worker_restarts",
            "Times a long-lived worker thread of the daemon raised and was started again (after a back-off).",
            labels=["worker"],
        )
        for name, n in self._workers.restarts().items():
            family.add_metric([name], float(n))
        return (family,)


__all__ = ["WorkerFailure", "Workers", "WorkersCollector"]
