"""Collector protocol and the adapter that serves collectors to prometheus_client.

Collectors are plain objects with a name and ``collect(snapshot, now)``, which turns the Snapshot it is handed into
metric families. They never call the backend. The daemon runs them once per Snapshot, when the exposition cache
renders /metrics (exporter/exposition.py through exporter/collectors/render.py), not once per scrape; most also
``write`` their series straight to that render (exporter/collectors/series.py) and build no families there.
``SnapshotExporter`` serves any of them to prometheus_client (the golden file, tests, benchmarks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from exporter.collectors.series import Family
from exporter.snapshot import GpuSnapshot, Snapshot

log = structlog.get_logger("collectors")

GPU_LABELS = ("gpu", "uuid")
SUCCESS = Family(
    "xpu_collector_success",
    "Whether the collector produced its metrics in the last render of /metrics (1) or not (0).",
    labels=("collector",),
)
DURATION = Family(
    "xpu_collector_duration_seconds", "Time the collector took in the last render of /metrics.", labels=("collector",)
)


def gpu_label_values(gpu: GpuSnapshot) -> list[str]:
    return [str(gpu.index), gpu.uuid]


def gpu_labels(gpu: GpuSnapshot) -> tuple[str, str]:
    """The values of GPU_LABELS for one card."""
    return str(gpu.index), gpu.uuid


class Collector(Protocol):
    name: str

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]: ...


class NoDataError(Exception):
    """A collector has nothing to report yet (not an error, but success=0)."""


class SnapshotExporter(PromCollector):
    """The prometheus_client collector: runs every enabled collector over the latest Snapshot, timing each."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        collectors: Sequence[Collector],
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._latest = latest
        self._collectors = tuple(collectors)
        self._clock = clock
        self._monotonic = monotonic

    @property
    def collectors(self) -> tuple[Collector, ...]:
        return self._collectors

    def collect(self) -> Iterator[Metric]:
        snapshot = self._latest()
        now = self._clock()
        success = GaugeMetricFamily(SUCCESS.name, SUCCESS.help, labels=SUCCESS.labels)
        duration = GaugeMetricFamily(DURATION.name, DURATION.help, labels=DURATION.labels)
        for collector in self._collectors:
            started = self._monotonic()
            ok = 0.0
            if snapshot is not None:
                try:
                    # materialise first so a failing collector yields nothing half-built
                    families = list(collector.collect(snapshot, now))
                except NoDataError:
                    families = []
                except Exception:
                    log.exception("collector failed", collector=collector.name)
                    families = []
                else:
                    ok = 1.0
                yield from families
            success.add_metric([collector.name], ok)
            duration.add_metric([collector.name], self._monotonic() - started)
        yield success
        yield duration

    def describe(self) -> Iterable[Metric]:
        return ()  # families vary with the node; keep registration from calling collect()
