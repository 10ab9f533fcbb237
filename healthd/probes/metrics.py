"""The probes' own counters, exported: how long each probe takes and how often it fails."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.snapshot import Snapshot
from healthd.probes.runner import ProbeRunner


class ProbeCollector:
    name = "probes"

    def __init__(self, runner: ProbeRunner) -> None:
        self._runner = runner

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        duration = GaugeMetricFamily(
            "xpu_probe_duration_seconds", "How long the probe's last evaluation took.", labels=["probe"]
        )
        failures = CounterMetricFamily(
            "xpu_probe_failures", "Probe evaluations that raised (the check reports unknown).", labels=["probe"]
        )
        evaluations = CounterMetricFamily(
            "xpu_probe_evaluations", "Evaluations of every probe over a new Snapshot.", value=self._runner.evaluations
        )
        stats = self._runner.stats()
        for probe in sorted(stats):
            seconds, failed = stats[probe]
            duration.add_metric([probe], seconds)
            failures.add_metric([probe], float(failed))
        return (duration, failures, evaluations)
