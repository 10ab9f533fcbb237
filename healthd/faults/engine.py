"""The fault engine: findings in, faults out, every change journaled before anyone hears of it.

Rules (one fault per identity = (check, code, GPU uuid) while active):

- Condition findings are level-triggered. A condition opens a fault once it is reported ``open_after_evaluations``
  reports of its check in a row; it resolves once ``resolve_after_evaluations`` reports in a row no longer
  contain it. Only a report that *knows* the GPU's state counts towards resolving: a CheckResult with status
  unknown for that GPU (or none at all) leaves the fault as it is, because stale data is not recovery.
- A fault that comes back within ``reopen_window_seconds`` of resolving is reopened (same id, count and flaps
  + 1) instead of opening a new one: flapping links show as one fault, not hundreds. Not across a reboot.
- Event findings open a fault; repeats of an active one add to its count and last_seen (written every time, but
  streamed as an "updated" record at most once per ``dedup_window_seconds``). An event fault whose action is
  below reset_gpu resolves after ``event_quiet_seconds`` without repeats. One that needs reset_gpu or
  reboot_node stays active until the node has rebooted (the boot id changed); a GPU reset without a reboot is
  not observed, so such a fault stays until then. Replace_node faults never resolve on their own.
- Escalation (escalation.py): every fatal finding notes the boot id it was seen in. When a fatal identity has been
  seen in more than ``escalation_reboots`` distinct boots within ``escalation_window_seconds`` (it came back after
  K reboots), it is opened as a new fault with action replace_node (record "escalated"); an older active fault
  with the same identity and a smaller action is resolved as superseded. A new fault id keeps "one hook call per
  fault id" true.
- A fault is queued to the replacement hooks once, the first time its action reaches ``hook_min_action``.

The engine is synchronous and thread-safe: ``report()``/``event()`` (the probe runner's FindingSink; the
``accept_*`` forms also return the records written) return after the journal commit (one fsync),
so whatever they accepted survives a kill -9. Listeners are called after each commit with the last sequence
number; the asyncio side turns that into wakeups (see notify.py).

Two locks keep readers off the disk: writers take ``_commit_lock`` (one batch at a time, so sequence numbers stay
in order), work out their changes under the short ``_state`` lock, and write the journal with only the commit lock
held. Readers (GetNodeHealth on the event loop, metrics scrapes) take only ``_state`` and see the faults as of the
last successful commit, never a change that is not on disk yet. An active condition's ``last_seen`` is stored at
most once per ``dedup_window_seconds``: after a crash it may be that much older, and nothing else is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from healthd.faults.escalation import RebootEscalation
from healthd.faults.fault import Fault, FaultRecord, FaultState, RecordKind, identity_of, new_fault
from healthd.faults.journal import Change, Journal
from healthd.faults.settings import FaultsSettings
from healthd.findings import Action, CheckResult, CheckStatus, Finding, FindingKind, GpuRef, ProbeReport

log = structlog.get_logger("faults")

PRUNE_EVERY_SECONDS = 3600.0


@dataclass(slots=True)
class _Pending:
    streak: int
    finding: Finding


@dataclass(frozen=True, slots=True)
class CheckState:
    result: CheckResult
    at: float


class FaultEngine:
    def __init__(
        self,
        journal: Journal,
        settings: FaultsSettings,
        *,
        boot_id: str,
        hook_targets: Sequence[str] = (),
        hook_min_action: Action = Action.REPLACE_NODE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._journal = journal
        self._s = settings
        self.boot_id = boot_id
        self._escalation = RebootEscalation(journal, settings, boot_id)
        self._targets = tuple(hook_targets)
        self._hook_min = hook_min_action
        self._clock = clock
        self._state = threading.RLock()  # in-memory state; never held across journal I/O
        self._commit_lock = threading.Lock()  # one batch of changes at a time, in sequence order
        self._listeners: list[Callable[[int], None]] = []
        self._active: dict[str, Fault] = {}  # identity -> active fault
        self._recently_resolved: dict[str, Fault] = {}  # identity -> last resolved fault (for reopening)
        self._pending: dict[str, _Pending] = {}  # condition identities not yet confirmed
        self._clear_streak: dict[str, int] = {}  # active condition identity -> clean known evaluations
        self._last_record_at: dict[str, float] = {}  # fault id -> when it last got a record
        self._stored_at: dict[str, float] = {}  # fault id -> when its state was last written (record or touch)
        self._committed: tuple[Fault, ...] = ()  # active faults as of the last commit: what readers see
        self._checks: dict[tuple[str, str], CheckState] = {}  # (check, gpu uuid or "") -> latest result
        self._statuses_version = 0  # moves when a check's status on a GPU does (see check_statuses)
        self._xid_counts: dict[tuple[str, str, str], int] = {}  # (gpu index, uuid, xid) -> events since start
        self._last_prune = 0.0
        for fault in journal.active_faults():
            self._active[fault.identity] = fault
        self._publish_committed()
        self._resolve_after_reboot()

    # -- the sink the probes call ------------------------------------------------------------------------------

    def report(self, report: ProbeReport) -> None:
        """The probe runner's sink entry (healthd.probes.runner.FindingSink)."""
        self.accept_report(report)

    def event(self, finding: Finding) -> None:
        """The XID watcher's sink entry."""
        self.accept_event(finding)

    def accept_report(self, report: ProbeReport) -> list[FaultRecord]:
        """One evaluation of one check: condition findings plus the per-GPU status; returns the records written."""
        now = self._clock()
        with self._commit_lock:
            self._escalation.learn(report.findings, now)
            with self._state:
                changes, touched = self._evaluate_report(report, now)
            return self._commit(changes, now, touched)

    def _evaluate_report(self, report: ProbeReport, now: float) -> tuple[list[Change], list[Fault]]:
        """The report's changes to the in-memory state (the caller holds both locks)."""
        for result in report.results:
            key = (result.check, _uuid(result.gpu))
            old = self._checks.get(key)
            if old is None or old.result.status is not result.status or old.result.gpu != result.gpu:
                self._statuses_version += 1
            self._checks[key] = CheckState(result, now)
        changes: list[Change] = []
        touched: list[Fault] = []
        seen: dict[str, Finding] = {}
        for finding in report.findings:
            if finding.kind is FindingKind.EVENT:
                self._on_event(finding, now, changes, touched)
            else:
                seen.setdefault(identity_of(finding.check, finding.code, finding.gpu), finding)
        for identity, finding in seen.items():
            self._on_condition_seen(identity, finding, now, changes, touched)
        known = _known_scopes(report.results)
        for identity, pending in list(self._pending.items()):
            check_matches = pending.finding.check == report.check and identity not in seen
            if check_matches and _scope_known(pending.finding.gpu, known):
                del self._pending[identity]
        for identity, fault in list(self._active.items()):
            if fault.check != report.check or fault.kind is FindingKind.EVENT or identity in seen:
                continue
            if not _scope_known(fault.gpu, known):
                continue  # stale or missing data: neither worse nor better
            streak = self._clear_streak.get(identity, 0) + 1
            self._clear_streak[identity] = streak
            if streak >= self._s.resolve_after_evaluations:
                changes.append(self._resolve(fault, now, "condition cleared"))
        return changes, touched

    def accept_event(self, finding: Finding) -> list[FaultRecord]:
        """A one-off finding (an XID line, an ECC event); returns the records written."""
        now = self._clock()
        with self._commit_lock:
            self._escalation.learn((finding,), now)
            changes: list[Change] = []
            touched: list[Fault] = []
            with self._state:
                self._on_event(finding, now, changes, touched)
            return self._commit(changes, now, touched)

    def tick(self) -> list[FaultRecord]:
        """Time-driven work: quiet event faults resolve, and retention runs now and then."""
        now = self._clock()
        with self._commit_lock:
            with self._state:
                changes = [
                    self._resolve(f, now, f"no repeat for {self._s.event_quiet_seconds:g}s")
                    for f in list(self._active.values())
                    if f.kind is FindingKind.EVENT
                    and f.action < Action.RESET_GPU
                    and now - f.last_seen >= self._s.event_quiet_seconds
                ]
            records = self._commit(changes, now, ())
            if now - self._last_prune >= PRUNE_EVERY_SECONDS:
                self._last_prune = now
                s = self._s
                pruned = self._journal.prune(
                    now, s.retention_seconds, s.retention_max_resolved, s.retention_max_records
                )
                if pruned:
                    log.info("journal retention", resolved_faults_deleted=pruned)
            return records

    # -- state for the health view and metrics -----------------------------------------------------------------

    def add_listener(self, callback: Callable[[int], None]) -> None:
        with self._state:
            self._listeners.append(callback)

    def active_faults(self) -> list[Fault]:
        """The active faults as of the last journal commit (never one that is not on disk yet)."""
        with self._state:
            return list(self._committed)

    def check_states(self) -> list[CheckState]:
        with self._state:
            return list(self._checks.values())

    def check_statuses(self) -> tuple[int, list[CheckState]]:
        """``check_states()`` with a version that moves whenever a check's status (or GPU) in them does, or a new
        check or GPU appears: under an equal version the states' (check, gpu, status) and their order are the
        same, however many reports repeated them (every report makes new CheckStates). Metrics keep their
        status lines under it."""
        with self._state:
            return self._statuses_version, list(self._checks.values())

    def xid_counts(self) -> Mapping[tuple[str, str, str], int]:
        with self._state:
            return dict(self._xid_counts)

    @property
    def journal(self) -> Journal:
        return self._journal

    @property
    def hook_targets(self) -> tuple[str, ...]:
        return self._targets

    # -- internals ---------------------------------------------------------------------------------------------

    def _on_condition_seen(
        self, identity: str, finding: Finding, now: float, changes: list[Change], touched: list[Fault]
    ) -> None:
        self._clear_streak.pop(identity, None)
        action = self._escalation.action(identity, finding, now)
        fault = self._active.get(identity)
        if fault is not None:
            if action == Action.REPLACE_NODE and fault.action < Action.REPLACE_NODE:
                self._escalate(fault, finding, action, now, changes)
                return
            self._update(fault, finding, action, now, changes, touched, repeat=False)
            return
        if self._reopen(identity, finding, action, now, changes):
            return
        pending = self._pending.get(identity)
        streak = (pending.streak if pending else 0) + 1
        if streak < self._s.open_after_evaluations:
            self._pending[identity] = _Pending(streak, finding)
            return
        self._pending.pop(identity, None)
        self._open(finding, action, now, changes, escalated=action != finding.action)

    def _on_event(self, finding: Finding, now: float, changes: list[Change], touched: list[Fault]) -> None:
        identity = identity_of(finding.check, finding.code, finding.gpu)
        if finding.code.startswith("xid_") and finding.gpu is not None:
            key = (str(finding.gpu.index), finding.gpu.uuid, finding.evidence.get("xid", finding.code[4:]))
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
        action = self._escalation.action(identity, finding, now)
        fault = self._active.get(identity)
        if fault is not None:
            if action == Action.REPLACE_NODE and fault.action < Action.REPLACE_NODE:
                self._escalate(fault, finding, action, now, changes)
            else:
                self._update(fault, finding, action, now, changes, touched, repeat=True)
            return
        if self._reopen(identity, finding, action, now, changes):
            return
        self._open(finding, action, now, changes, escalated=action != finding.action)

    def _open(self, finding: Finding, action: Action, now: float, changes: list[Change], *, escalated: bool) -> None:
        evidence = dict(finding.evidence)
        if escalated:
            evidence["escalated_from_action"] = finding.action.label
            evidence["escalation_reboots"] = str(self._s.escalation_reboots)
        seq = self._journal.last_seq + len(changes) + 1
        fault = new_fault(finding, opened_seq=seq, now=now, boot_id=self.boot_id, action=action, evidence=evidence)
        kind = RecordKind.ESCALATED if escalated else RecordKind.OPENED
        changes.append(self._change(kind, fault, "returned after reboots" if escalated else ""))

    def _escalate(self, old: Fault, finding: Finding, action: Action, now: float, changes: list[Change]) -> None:
        changes.append(self._resolve(old, now, "superseded: escalated to replace_node"))
        self._open(finding, action, now, changes, escalated=True)

    def _reopen(self, identity: str, finding: Finding, action: Action, now: float, changes: list[Change]) -> bool:
        old = self._recently_resolved.get(identity)
        if old is None or old.resolved_at is None or now - old.resolved_at > self._s.reopen_window_seconds:
            return False
        if old.boot_id != self.boot_id:
            return False  # a reboot was an action taken: what comes back after it is a new fault
        if action > old.action:
            return False  # worse than before: a new fault, so the hook sees a new id
        del self._recently_resolved[identity]
        fault = replace(
            old,
            state=FaultState.ACTIVE,
            resolved_at=None,
            resolve_reason="",
            last_seen=now,
            count=old.count + 1,
            flaps=old.flaps + 1,
            message=finding.message,
            evidence=dict(finding.evidence),
            boot_id=self.boot_id,
        )
        changes.append(self._change(RecordKind.REOPENED, fault, f"back within {self._s.reopen_window_seconds:g}s"))
        return True

    def _update(
        self,
        fault: Fault,
        finding: Finding,
        action: Action,
        now: float,
        changes: list[Change],
        touched: list[Fault],
        *,
        repeat: bool,
    ) -> None:
        worse = finding.severity > fault.severity or action > fault.action
        updated = replace(
            fault,
            last_seen=now,
            count=fault.count + 1 if repeat else fault.count,
            severity=max(fault.severity, finding.severity),
            action=max(fault.action, action),
            message=finding.message,
            evidence=dict(finding.evidence) if repeat or worse else fault.evidence,
            boot_id=self.boot_id,
        )
        last = self._last_record_at.get(fault.id, fault.first_seen)
        for i, change in enumerate(changes):
            if change.fault.id == fault.id:  # it already has a record in this batch: that record carries it
                redo = self._change(change.kind, updated, change.detail)  # may now reach the hook's level
                changes[i] = replace(redo, outbox_targets=change.outbox_targets or redo.outbox_targets)
                return
        if worse or (repeat and now - last >= self._s.dedup_window_seconds):
            changes.append(self._change(RecordKind.UPDATED, updated, "worse" if worse else "repeated"))
        else:
            self._active[fault.identity] = updated
            stored = max(last, self._stored_at.get(fault.id, 0.0))
            if repeat or now - stored >= self._s.dedup_window_seconds:
                touched.append(updated)

    def _resolve(self, fault: Fault, now: float, reason: str) -> Change:
        resolved = replace(fault, state=FaultState.RESOLVED, resolved_at=now, resolve_reason=reason)
        return self._change(RecordKind.RESOLVED, resolved, reason)

    def _change(self, kind: RecordKind, fault: Fault, detail: str) -> Change:
        targets: tuple[str, ...] = ()
        if fault.active and not fault.hooked and fault.action >= self._hook_min and self._targets:
            fault = replace(fault, hooked=True)
            targets = self._targets
        # keep the in-memory view in step with the changes about to be committed
        if fault.active:
            self._active[fault.identity] = fault
        else:
            if self._active.get(fault.identity, fault).id == fault.id:
                self._active.pop(fault.identity, None)
            self._recently_resolved[fault.identity] = fault
            self._clear_streak.pop(fault.identity, None)
        return Change(kind, fault, detail, targets)

    def _commit(self, changes: list[Change], now: float, touched: Iterable[Fault]) -> list[FaultRecord]:
        """Write the batch (the caller holds ``_commit_lock``, not ``_state``), then publish it to readers."""
        touched = [t for t in touched if all(c.fault.id != t.id for c in changes)]
        boots = self._escalation.unwritten()  # fatal identities seen in this boot, noted with these records
        if not changes and not touched and not boots:
            return []
        try:
            records = self._journal.commit(changes, now, touched=touched, fatal_boots=boots)
        except Exception:
            # the in-memory view ran ahead of the journal: reload it so nothing unjournaled is believed
            active = self._journal.active_faults()
            with self._state:
                self._reload(active)
            raise
        self._escalation.written(boots)
        with self._state:
            for fault in touched:
                self._stored_at[fault.id] = now
            for record in records:
                if record.fault.active:
                    self._last_record_at[record.fault.id] = record.at
                    self._stored_at[record.fault.id] = record.at
                else:
                    self._last_record_at.pop(record.fault.id, None)
                    self._stored_at.pop(record.fault.id, None)
                if record.fault.active:
                    self._active[record.fault.identity] = record.fault
                elif self._recently_resolved.get(record.fault.identity, record.fault).id == record.fault.id:
                    self._recently_resolved[record.fault.identity] = record.fault
            self._publish_committed()
            listeners = list(self._listeners)
        if records:
            for listener in listeners:
                listener(records[-1].seq)
        return records

    def _publish_committed(self) -> None:
        """What readers see: the active faults as of the last commit, oldest first (caller holds ``_state``)."""
        self._committed = tuple(sorted(self._active.values(), key=lambda f: f.opened_seq))

    def _reload(self, active: Sequence[Fault]) -> None:
        self._active = {f.identity: f for f in active}
        self._publish_committed()
        self._pending.clear()
        self._clear_streak.clear()

    def _resolve_after_reboot(self) -> None:
        now = self._clock()
        with self._commit_lock:
            with self._state:
                changes = [
                    self._resolve(f, now, f"node rebooted since (boot {f.boot_id[:8]} -> {self.boot_id[:8]})")
                    for f in list(self._active.values())
                    if f.kind is FindingKind.EVENT
                    and Action.RESET_GPU <= f.action <= Action.REBOOT_NODE
                    and f.boot_id != self.boot_id
                    and self.boot_id != "unknown"
                ]
            self._commit(changes, now, ())

    # -- operator action ---------------------------------------------------------------------------------------

    def resolve_by_operator(self, fault_id: str, reason: str) -> FaultRecord | None:
        """Resolve one active fault by hand (after a repair); None when no active fault has this id.

        Journaled like any resolve (record kind resolved, detail "operator: <reason>") and streamed. A condition
        that is still there is reported again by its check and reopens the fault.
        """
        now = self._clock()
        with self._commit_lock:
            with self._state:
                fault = next((f for f in self._active.values() if f.id == fault_id), None)
                if fault is None:
                    return None
                change = self._resolve(fault, now, f"operator: {reason}")
            records = self._commit([change], now, ())
            return records[-1] if records else None


def _uuid(gpu: GpuRef | None) -> str:
    return gpu.uuid if gpu is not None else ""


def _known_scopes(results: Sequence[CheckResult]) -> set[str]:
    """GPU uuids (and "" for node-wide) whose state this report knows.

    A node-wide fault counts as known when the report has a node-wide result that is not unknown, or, lacking
    one, when it has results and none of them is unknown.
    """
    known = {_uuid(r.gpu) for r in results if r.status is not CheckStatus.UNKNOWN}
    all_known = bool(results) and all(r.status is not CheckStatus.UNKNOWN for r in results)
    if all_known and not any(r.gpu is None for r in results):
        known.add("")
    return known


def _scope_known(gpu: GpuRef | None, known: set[str]) -> bool:
    return _uuid(gpu) in known
