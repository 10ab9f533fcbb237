"""Fault and health metrics, from the engine's in-memory state (a scrape never touches SQLite).

A SeriesCollector (exporter/collectors/series.py); the snapshot is not used. Its blocks, each kept while its version
is unchanged: the status lines of each check (checks x cards x statuses, the bulk of a large node), the active
faults, the XID counts, and the journal sequence with the hook outbox. Probes report every snapshot, and every
report makes new CheckStates, so the status blocks are versioned by the engine's ``check_statuses`` version (it
moves only when a status does) and by each check's (gpu, uuid, status) tuples: an unchanged node costs a few
comparisons, and a check whose status changed rewrites only its own lines.
"""

from __future__ import annotations

from exporter.collectors.series import COUNTER, Exposer, Family, SeriesCollector
from exporter.snapshot import Snapshot
from healthd.faults.engine import CheckState, FaultEngine
from healthd.faults.outbox import HookDispatcher
from healthd.findings import CheckStatus, GpuRef

STATUS_VALUES = tuple(s.value for s in CheckStatus)

_FAULT_LABELS = ("gpu", "uuid", "code", "action", "severity", "fault_id", "node")
STATUS = Family(
    "xpu_health_check_status",
    "Latest status of a health check on a GPU (gpu and uuid empty: node-wide); 1 for the current status.",
    labels=("check", "gpu", "uuid", "status"),
)
# one series per active fault (resolved ones leave): the fault id rides into the alert, and from there into the
# webhook's idempotency key, so both hook channels name a fault the same way
ACTIVE = Family(
    "xpu_faults_active",
    "Active faults, 1 per fault: GPU (gpu and uuid empty: node-wide), code, recommended action, severity, "
    "the daemon's fault id and the node's canonical name.",
    labels=_FAULT_LABELS,
)
OPENED = Family(
    "xpu_fault_opened_timestamp_seconds",
    "When each active fault was first seen (unix time), with the labels of xpu_faults_active.",
    labels=_FAULT_LABELS,
)
XID = Family(
    "xpu_xid_errors",
    "XID events seen since the daemon started, by GPU and XID code.",
    COUNTER,
    ("gpu", "uuid", "xid"),
)
JOURNAL_SEQ = Family("xpu_faults_journal_seq", "Sequence number of the latest fault journal record.")
OUTBOX_DEPTH = Family(
    "xpu_hook_outbox_depth", "Faults queued for a replacement hook and not yet acknowledged.", labels=("target",)
)
DELIVERY_FAILURES = Family(
    "xpu_hook_delivery_failures",
    "Failed deliveries to a replacement hook since the daemon started.",
    COUNTER,
    ("target",),
)

_CheckLines = tuple[tuple[str, str, str], ...]  # one check's (gpu, uuid, status) by card, in the lines' order
_Statuses = tuple[tuple[str, _CheckLines], ...]  # by check, sorted


class FaultMetricsCollector(SeriesCollector):
    name = "faults"

    def __init__(self, engine: FaultEngine, dispatcher: HookDispatcher | None = None, *, node_name: str = "") -> None:
        self._engine = engine
        self._dispatcher = dispatcher
        self._node = node_name
        # the check statuses grouped for the blocks, under the engine's version they were grouped at (one reference,
        # swapped whole: a render and a families() call on another thread at worst both group the same states)
        self._statuses: tuple[int, _Statuses] = (-1, ())

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(STATUS, ACTIVE, OPENED, XID, JOURNAL_SEQ)
        if self._dispatcher is not None:
            out.declare(OUTBOX_DEPTH, DELIVERY_FAILURES)

        for check, lines in self._grouped_statuses():
            # an equal tuple (a regrouping after another check changed) or the same one (nothing changed) keeps
            # the check's lines
            if (rows := out.block(("status", check), lines)) is not None:
                for gpu, uuid, status in lines:
                    for value in STATUS_VALUES:
                        rows.add(STATUS, (check, gpu, uuid, value), 1.0 if status == value else 0.0)

        # Faults are immutable and replaced when they change: equal faults, equal lines
        faults = tuple(sorted(self._engine.active_faults(), key=lambda f: f.opened_seq))
        if (rows := out.block("faults", faults)) is not None:
            for f in faults:
                values = (*_gpu_labels(f.gpu), f.code, f.action.label, f.severity.name.lower(), f.id, self._node)
                rows.add(ACTIVE, values, 1.0)
                rows.add(OPENED, values, f.first_seen)

        xids = tuple(sorted(self._engine.xid_counts().items()))
        if (rows := out.block("xid", xids)) is not None:
            for key, n in xids:
                rows.add(XID, key, float(n))

        # the journal's sequence and the hooks' counts move often and are a few lines: one block for them all
        dispatcher, targets, seq = self._dispatcher, self._engine.hook_targets, self._engine.journal.last_seq
        hooks: tuple[tuple[int, int], ...] = ()
        if dispatcher is not None:
            hooks = tuple((dispatcher.depth.get(t, 0), dispatcher.failures.get(t, 0)) for t in targets)
        if (rows := out.block("journal", (seq, hooks))) is not None:
            rows.add(JOURNAL_SEQ, (), float(seq))
            if dispatcher is not None:
                for target, (depth, failures) in zip(targets, hooks, strict=True):
                    rows.add(OUTBOX_DEPTH, (target,), float(depth))
                    rows.add(DELIVERY_FAILURES, (target,), float(failures))

    def _grouped_statuses(self) -> _Statuses:
        version, states = self._engine.check_statuses()
        kept = self._statuses
        if kept[0] == version:
            return kept[1]
        grouped = _group(states)
        self._statuses = (version, grouped)
        return grouped


def _group(states: list[CheckState]) -> _Statuses:
    """The states by check (sorted), each check's by card index (node-wide first; a stable sort, as one sort of all
    states by (check, card index) would order them)."""
    by_check: dict[str, list[CheckState]] = {}
    for state in states:
        by_check.setdefault(state.result.check, []).append(state)
    out = []
    for check in sorted(by_check):
        ordered = sorted(by_check[check], key=lambda c: _gpu_key(c.result.gpu))
        out.append((check, tuple((*_gpu_labels(c.result.gpu), c.result.status.value) for c in ordered)))
    return tuple(out)


def _gpu_labels(gpu: GpuRef | None) -> tuple[str, str]:
    """The ``gpu`` and ``uuid`` label values of a card, empty for node-wide checks and faults."""
    return ("", "") if gpu is None else (str(gpu.index), gpu.uuid)


def _gpu_key(gpu: object) -> int:
    index = getattr(gpu, "index", -1)
    return int(index)
