"""The XID watcher's own counters, exported: what happened to each XID sighting, and how many kernel-log records
were lost before they could be read. (The XIDs themselves are ``xpu_xid_errors``, from the fault engine.)"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.snapshot import Snapshot
from healthd.xid.watcher import XidWatcher


class XidCollector:
    name = "xid"

    def __init__(self, watcher: XidWatcher) -> None:
        self._watcher = watcher

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        xid = CounterMetricFamily(
            "xpu_xid_events",
            "XID sightings by source (nvml, kmsg) and outcome: reported (a finding), merged (the same incident seen "
            "again), ignored (not an XID), rejected (a kernel-log line that is not the driver's).",
            labels=["source", "outcome"],
        )
        for (source, outcome), n in sorted(self._watcher.event_counts().items()):
            xid.add_metric([source, outcome], float(n))
        overwritten = CounterMetricFamily(
            "xpu_kmsg_records_overwritten",
            "Kernel-log records the kernel overwrote before they were read: XIDs in them were lost to the kmsg "
            "source (NVML events still report them).",
            value=self._watcher.kmsg_overwritten(),
        )
        return (xid, overwritten)
