"""Runs every probe over each new Snapshot and hands the reports to a sink (the fault engine).

A probe that raises yields an ``unknown`` result carrying the error; it never stops the other probes or the runner.
``on_snapshot`` is meant to be subscribed to the Sampler (it runs on the sampler thread, so probes must be cheap:
see bench/probes.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from exporter.snapshot import Snapshot
from healthd.findings import CheckResult, CheckStatus, Finding, ProbeReport
from healthd.probes.base import Probe

log = structlog.get_logger("probes")


class FindingSink(Protocol):
    def report(self, report: ProbeReport) -> None:
        """One probe's complete view after an evaluation: its condition findings and per-GPU results."""

    def event(self, finding: Finding) -> None:
        """A one-off event finding (an XID)."""


class ProbeRunner:
    def __init__(
        self,
        probes: Sequence[Probe],
        sink: FindingSink,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
        checkpoint: Callable[[], None] = lambda: None,
    ) -> None:
        """``checkpoint``: called before each probe (the daemon's requests in flight, which it may wait for:
        exporter/inflight.py)."""
        names = [p.name for p in probes]
        if len(set(names)) != len(names):
            raise ValueError(f"probe names must be unique, got {names}")
        self.probes = tuple(probes)
        self._sink = sink
        self._clock = clock
        self._monotonic = monotonic
        self._checkpoint = checkpoint
        self.evaluations = 0
        self.failures: Counter[str] = Counter()  # probe name -> evaluations that raised
        self.last_seconds: dict[str, float] = {}  # probe name -> duration of its last evaluation
        self._lock = threading.Lock()  # evaluations run on the probes' thread, metrics are read on the scrape's

    def on_snapshot(self, snapshot: Snapshot) -> list[ProbeReport]:
        now = self._clock()
        reports = []
        for probe in self.probes:
            self._checkpoint()
            started = self._monotonic()
            try:
                report = probe.evaluate(snapshot, now)
            except Exception as exc:
                with self._lock:
                    self.failures[probe.name] += 1
                log.exception("probe failed", probe=probe.name)
                detail = f"probe failed: {type(exc).__name__}: {exc}"
                report = ProbeReport(probe.name, (CheckResult(probe.name, None, CheckStatus.UNKNOWN, detail),), ())
            with self._lock:
                self.last_seconds[probe.name] = self._monotonic() - started
            try:
                self._sink.report(report)
            except Exception:
                log.exception("finding sink failed", probe=probe.name)
            reports.append(report)
        with self._lock:
            self.evaluations += 1
        return reports

    def stats(self) -> dict[str, tuple[float, int]]:
        """Probe name -> (seconds its last evaluation took, evaluations that raised)."""
        with self._lock:
            return {p.name: (self.last_seconds.get(p.name, 0.0), self.failures[p.name]) for p in self.probes}
