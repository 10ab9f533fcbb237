"""The exporter's view of itself: backend state, sample age, cycle time, call errors and timeouts."""

from __future__ import annotations

from exporter.backends.types import Unsupported
from exporter.collectors.series import COUNTER, INFO, Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import Snapshot
from exporter.version import VERSION

BUILD = Family("xpu_build", "Version of xpu-runtime-kit.", INFO, ("version",))
BACKEND = Family(
    "xpu_backend",
    "The GPU backend and driver versions.",
    INFO,
    ("backend", "driver_version", "nvml_version", "cuda_driver_version"),
)
BACKEND_UP = Family("xpu_backend_up", "Whether the GPU library is initialised (1) or failing (0).")
AGE = Family("xpu_sample_age_seconds", "Seconds since the last sampling cycle finished, when /metrics was rendered.")
CYCLE = Family("xpu_sampler_cycle_seconds", "Wall time the last sampling cycle took.")
INTERVAL = Family("xpu_sampler_interval_seconds", "Configured sampling interval.")
GPUS = Family("xpu_gpus", "GPUs the backend reports.")
CALLS = Family("xpu_backend_calls", "Backend calls made, by call.", COUNTER, ("call",))
ERRORS = Family(
    "xpu_backend_call_errors", "Backend calls that failed, by call and error code.", COUNTER, ("call", "code")
)
TIMEOUTS = Family(
    "xpu_backend_call_timeouts",
    "Backend calls that passed their deadline (a hung driver call counts once).",
    COUNTER,
    ("call",),
)
FAILING = Family(
    "xpu_gpu_sample_failure",
    "1 for each card whose last sampling cycle failed, with why (timeout, gpu_lost, reset_required, ...).",
    labels=("gpu", "uuid", "code"),
)
STUCK = Family(
    "xpu_driver_call_stuck_seconds",
    "Driver calls past their deadline that have not returned, by lane (card index, node, events) and call: "
    "how long each has been in the driver. While one is here, further calls to its lane fail at once.",
    labels=("lane", "call"),
)
SKIPPED = Family(
    "xpu_snapshot_subscriber_skipped",
    "Snapshots a subscriber (probes, attribution, ...) skipped because it was still busy with an older one.",
    COUNTER,
    ("subscriber",),
)
SUB_FAILURES = Family(
    "xpu_snapshot_subscriber_failures", "Snapshot subscriber runs that raised.", COUNTER, ("subscriber",)
)
SUB_SECONDS = Family(
    "xpu_snapshot_subscriber_duration_seconds", "How long the subscriber's last run took.", labels=("subscriber",)
)
FAMILIES = (
    BUILD, BACKEND, BACKEND_UP, AGE, CYCLE, INTERVAL, GPUS, CALLS, ERRORS, TIMEOUTS, FAILING,
    STUCK, SKIPPED, SUB_FAILURES, SUB_SECONDS,
)  # fmt: skip


class SelfCollector(SeriesCollector):
    """The build and backend identity are one block kept while they are unchanged; the rest changes every cycle."""

    name = "self"

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(*FAMILIES)
        if (rows := out.block("identity", (snapshot.backend_name, snapshot.system))) is not None:
            rows.add(BUILD, (VERSION,), 1.0)
            if snapshot.system is not None:
                s = snapshot.system
                cuda = "" if isinstance(s.cuda_driver_version, Unsupported) else str(s.cuda_driver_version)
                rows.add(BACKEND, (snapshot.backend_name, s.driver_version, s.nvml_version, cuda), 1.0)
        if (rows := out.block("cycle", (snapshot, now))) is not None:
            self._cycle(rows, snapshot, now)

    @staticmethod
    def _cycle(rows: Rows, snapshot: Snapshot, now: float) -> None:
        rows.add(BACKEND_UP, (), 1.0 if snapshot.backend_up else 0.0)
        rows.add(AGE, (), max(0.0, now - snapshot.taken_at))
        rows.add(CYCLE, (), snapshot.cycle_seconds)
        rows.add(INTERVAL, (), snapshot.interval_seconds)
        rows.add(GPUS, (), float(len(snapshot.gpus)))
        for call, n in sorted(snapshot.counters.calls.items()):
            rows.add(CALLS, (call,), float(n))
        for (call, code), n in sorted(snapshot.counters.errors.items()):
            rows.add(ERRORS, (call, code), float(n))
        for call, n in sorted(snapshot.counters.timeouts.items()):
            rows.add(TIMEOUTS, (call,), float(n))
        for gpu in snapshot.gpus:
            if not gpu.fresh:
                rows.add(FAILING, (str(gpu.index), gpu.uuid, gpu.error_code or "error"), 1.0)
        for stuck in snapshot.stuck_calls:
            rows.add(STUCK, (stuck.lane, stuck.call), stuck.seconds)
        for sub in snapshot.subscribers:
            rows.add(SKIPPED, (sub.name,), float(sub.skipped))
            rows.add(SUB_FAILURES, (sub.name,), float(sub.failures))
            rows.add(SUB_SECONDS, (sub.name,), sub.last_seconds)
