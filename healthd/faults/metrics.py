"""Fault and health metrics, from the engine's in-memory state (a scrape never touches SQLite).

Implements the exporter's collector protocol (``name`` and ``collect(snapshot, now)``); the snapshot is not used.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.snapshot import Snapshot
from healthd.faults.engine import FaultEngine
from healthd.faults.outbox import HookDispatcher
from healthd.findings import CheckStatus, GpuRef

STATUS_VALUES = tuple(s.value for s in CheckStatus)


class FaultMetricsCollector:
    name = "faults"

    def __init__(self, engine: FaultEngine, dispatcher: HookDispatcher | None = None, *, node_name: str = "") -> None:
        self._engine = engine
        self._dispatcher = dispatcher
        self._node = node_name

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        status = GaugeMetricFamily(
            "xpu_health_check_status",
            "Latest status of a health check on a GPU (gpu and uuid empty: node-wide); 1 for the current status.",
            labels=["check", "gpu", "uuid", "status"],
        )
        for state in sorted(self._engine.check_states(), key=lambda c: (c.result.check, _gpu_key(c.result.gpu))):
            r = state.result
            gpu, uuid = _gpu_labels(r.gpu)
            for value in STATUS_VALUES:
                status.add_metric([r.check, gpu, uuid, value], 1.0 if r.status.value == value else 0.0)
        yield status

        # one series per active fault (resolved ones leave): the fault id rides into the alert, and from there into
        # the webhook's idempotency key, so both hook channels name a fault the same way
        labels = ["gpu", "uuid", "code", "action", "severity", "fault_id", "node"]
        active = GaugeMetricFamily(
            "xpu_faults_active",
            "Active faults, 1 per fault: GPU (gpu and uuid empty: node-wide), code, recommended action, severity, "
            "the daemon's fault id and the node's canonical name.",
            labels=labels,
        )
        opened = GaugeMetricFamily(
            "xpu_fault_opened_timestamp_seconds",
            "When each active fault was first seen (unix time), with the labels of xpu_faults_active.",
            labels=labels,
        )
        for f in sorted(self._engine.active_faults(), key=lambda f: f.opened_seq):
            values = [*_gpu_labels(f.gpu), f.code, f.action.label, f.severity.name.lower(), f.id, self._node]
            active.add_metric(values, 1.0)
            opened.add_metric(values, f.first_seen)
        yield active
        yield opened

        xid = CounterMetricFamily(
            "xpu_xid_errors", "XID events seen since the daemon started, by GPU and XID code.",
            labels=["gpu", "uuid", "xid"],
        )  # fmt: skip
        for (gpu, uuid, code), n in sorted(self._engine.xid_counts().items()):
            xid.add_metric([gpu, uuid, code], float(n))
        yield xid

        yield GaugeMetricFamily(
            "xpu_faults_journal_seq", "Sequence number of the latest fault journal record.",
            value=float(self._engine.journal.last_seq),
        )  # fmt: skip

        if self._dispatcher is not None:
            depth = GaugeMetricFamily(
                "xpu_hook_outbox_depth", "Faults queued for a replacement hook and not yet acknowledged.",
                labels=["target"],
            )  # fmt: skip
            failures = CounterMetricFamily(
                "xpu_hook_delivery_failures", "Failed deliveries to a replacement hook since the daemon started.",
                labels=["target"],
            )  # fmt: skip
            for target in self._engine.hook_targets:
                depth.add_metric([target], float(self._dispatcher.depth.get(target, 0)))
                failures.add_metric([target], float(self._dispatcher.failures.get(target, 0)))
            yield depth
            yield failures


def _gpu_labels(gpu: GpuRef | None) -> tuple[str, str]:
    """The ``gpu`` and ``uuid`` label values of a card, empty for node-wide checks and faults."""
    return ("", "") if gpu is None else (str(gpu.index), gpu.uuid)


def _gpu_key(gpu: object) -> int:
    index = getattr(gpu, "index", -1)
    return int(index)
