"""The probes' and the XID watcher's own counters, exported: how long each probe takes, how often it fails, what
happened to each XID sighting, and how many kernel-log records were lost before they could be read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.snapshot import Snapshot
from healthd.probes.runner import ProbeRunner


class ProbeCollector:
    name = "probes"

    def __init__(
        self,
        runner: ProbeRunner,
        xid_counts: Callable[[], Mapping[tuple[str, str], int]] = dict,
        kmsg_overwritten: Callable[[], int] = lambda: 0,
    ) -> None:
        self._runner = runner
        self._xid_counts = xid_counts
        self._kmsg_overwritten = kmsg_overwritten

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
        xid = CounterMetricFamily(
            "xpu_xid_events",
            "XID sightings by source (nvml, kmsg) and outcome: reported (a finding), merged (the same incident seen "
            "again), ignored (not an XID), rejected (a kernel-log line that is not the driver's).",
            labels=["source", "outcome"],
        )
        for (source, outcome), n in sorted(self._xid_counts().items()):
            xid.add_metric([source, outcome], float(n))
        overwritten = CounterMetricFamily(
            "xpu_kmsg_records_overwritten",
            "Kernel-log records the kernel overwrote before they were read: XIDs in them were lost to the kmsg "
            "source (NVML events still report them).",
            value=self._kmsg_overwritten(),
        )
        return (duration, failures, evaluations, xid, overwritten)
