"""Supervised workers: a loop that raises is counted, shown as failing, and started again with back-off."""

from __future__ import annotations

import threading

from exporter.supervision import Workers, WorkersCollector
from tests.support.waiting import eventually


def test_a_loop_that_raises_is_restarted_counted_and_shown() -> None:
    stop = threading.Event()
    runs: list[int] = []

    def loop() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise OSError("database is locked")
        stop.wait()

    workers = Workers(backoff_seconds=0.01, max_backoff_seconds=0.05)
    thread = workers.start("xid-nvml", loop, stop)
    assert eventually(lambda: len(runs) == 3, 5.0), "restarted after each failure"
    assert workers.restarts() == {"xid-nvml": 2}
    (failure,) = workers.failing()
    assert failure.worker == "xid-nvml" and "OSError: database is locked" in failure.error
    assert "xid-nvml restarted 2x" in failure.describe(workers.now())
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    (family,) = WorkersCollector(workers).collect(None, 0.0)  # type: ignore[arg-type]
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == [({"worker": "xid-nvml"}, 2)]


def test_a_loop_that_returns_early_counts_as_a_failure_and_old_failures_age_out() -> None:
    stop = threading.Event()
    now = [100.0]
    calls: list[int] = []

    def loop() -> None:
        calls.append(1)
        if len(calls) > 1:
            stop.wait()

    workers = Workers(backoff_seconds=0.01, degraded_seconds=60.0, monotonic=lambda: now[0])
    workers.start("kmsg-reader", loop, stop)
    assert eventually(lambda: len(calls) == 2, 5.0)
    assert "returned" in workers.failing()[0].error
    now[0] += 61.0
    assert workers.failing() == (), "a failure older than the window no longer degrades the node"
    assert workers.restarts() == {"kmsg-reader": 1}
    stop.set()


def test_a_stopped_worker_is_not_restarted() -> None:
    stop = threading.Event()
    workers = Workers(backoff_seconds=0.01)
    thread = workers.start("sampler", stop.wait, stop)
    stop.set()
    thread.join(5)
    assert workers.restarts() == {"sampler": 0} and workers.failing() == ()
