"""Snapshot -> series (exporter/collectors/series.py). The list below is the one list of the exporter's own
collectors; adding one is one line."""

from __future__ import annotations

from exporter.collectors.base import Collector, NoDataError, SnapshotExporter
from exporter.collectors.card import CardCollector
from exporter.collectors.mig import MigCollector
from exporter.collectors.profiling import ProfilingCollector
from exporter.collectors.self_metrics import SelfCollector


def default_collectors() -> list[Collector]:
    return [CardCollector(), MigCollector(), ProfilingCollector(), SelfCollector()]


__all__ = ["Collector", "NoDataError", "SnapshotExporter", "default_collectors"]
