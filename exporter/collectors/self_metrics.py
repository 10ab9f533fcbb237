"""The exporter's view of itself: backend state, sample age, cycle time, call errors and timeouts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.backends.types import Unsupported
from exporter.snapshot import Snapshot
from exporter.version import VERSION


class SelfCollector:
    name = "self"

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        build = InfoMetricFamily("xpu_build", "Version of xpu-runtime-kit.")
        build.add_metric([], {"version": VERSION})
        backend = InfoMetricFamily(
            "xpu_backend",
            "The GPU backend and driver versions.",
            labels=["backend", "driver_version", "nvml_version", "cuda_driver_version"],
        )
        if snapshot.system is not None:
            s = snapshot.system
            cuda = "" if isinstance(s.cuda_driver_version, Unsupported) else str(s.cuda_driver_version)
            backend.add_metric([snapshot.backend_name, s.driver_version, s.nvml_version, cuda], {})
        up = GaugeMetricFamily(
            "xpu_backend_up",
            "Whether the GPU library is initialised (1) or failing (0).",
            value=1.0 if snapshot.backend_up else 0.0,
        )
        age = GaugeMetricFamily(
            "xpu_sample_age_seconds",
            "Seconds since the last sampling cycle finished, when /metrics was rendered.",
            value=max(0.0, now - snapshot.taken_at),
        )
        cycle = GaugeMetricFamily(
            "xpu_sampler_cycle_seconds", "Wall time the last sampling cycle took.", value=snapshot.cycle_seconds
        )
        interval = GaugeMetricFamily(
            "xpu_sampler_interval_seconds", "Configured sampling interval.", value=snapshot.interval_seconds
        )
        gpus = GaugeMetricFamily("xpu_gpus", "GPUs the backend reports.", value=float(len(snapshot.gpus)))
        calls = CounterMetricFamily("xpu_backend_calls", "Backend calls made, by call.", labels=["call"])
        for call, n in sorted(snapshot.counters.calls.items()):
            calls.add_metric([call], float(n))
        errors = CounterMetricFamily(
            "xpu_backend_call_errors", "Backend calls that failed, by call and error code.", labels=["call", "code"]
        )
        for (call, code), n in sorted(snapshot.counters.errors.items()):
            errors.add_metric([call, code], float(n))
        timeouts = CounterMetricFamily(
            "xpu_backend_call_timeouts",
            "Backend calls that passed their deadline (a hung driver call counts once).",
            labels=["call"],
        )
        for call, n in sorted(snapshot.counters.timeouts.items()):
            timeouts.add_metric([call], float(n))
        failing = GaugeMetricFamily(
            "xpu_gpu_sample_failure",
            "1 for each card whose last sampling cycle failed, with why (timeout, gpu_lost, reset_required, ...).",
            labels=["gpu", "uuid", "code"],
        )
        for gpu in snapshot.gpus:
            if not gpu.fresh:
                failing.add_metric([str(gpu.index), gpu.uuid, gpu.error_code or "error"], 1.0)
        stuck = GaugeMetricFamily(
            "xpu_driver_call_stuck_seconds",
            "Driver calls past their deadline that have not returned, by lane (card index, node, events) and call: "
            "how long each has been in the driver. While one is here, further calls to its lane fail at once.",
            labels=["lane", "call"],
        )
        for stuck_call in snapshot.stuck_calls:
            stuck.add_metric([stuck_call.lane, stuck_call.call], stuck_call.seconds)
        skipped = CounterMetricFamily(
            "xpu_snapshot_subscriber_skipped",
            "Snapshots a subscriber (probes, attribution, ...) skipped because it was still busy with an older one.",
            labels=["subscriber"],
        )
        sub_failures = CounterMetricFamily(
            "xpu_snapshot_subscriber_failures", "Snapshot subscriber runs that raised.", labels=["subscriber"]
        )
        sub_seconds = GaugeMetricFamily(
            "xpu_snapshot_subscriber_duration_seconds",
            "How long the subscriber's last run took.",
            labels=["subscriber"],
        )
        for sub in snapshot.subscribers:
            skipped.add_metric([sub.name], float(sub.skipped))
            sub_failures.add_metric([sub.name], float(sub.failures))
            sub_seconds.add_metric([sub.name], sub.last_seconds)
        return (
            build, backend, up, age, cycle, interval, gpus, calls, errors, timeouts, failing,
            stuck, skipped, sub_failures, sub_seconds,
        )  # fmt: skip
