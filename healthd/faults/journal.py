"""The durable fault journal: SQLite in WAL mode under the state directory.

Every record is committed (synchronous=FULL: the WAL is fsynced at each commit, so a record survives a kill -9
and a power cut) before anyone is told about it. One writer, the engine; reads come from the gRPC service and the
hook dispatcher through the same connection, serialised by a lock, each call short.

Tables: ``faults`` (current state of every fault), ``records`` (the change log streamed by WatchFaults, keyed by
the node-wide sequence number), ``outbox`` (hook deliveries, one row per target and record), ``fatal_boots``
(in which boots a fatal identity was seen, for escalation), ``meta`` (the last sequence number ever handed out,
so sequence numbers stay monotonic even after retention deleted every record).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from healthd.faults.fault import Fault, FaultFilter, FaultRecord, HookDelivery, OutboxItem, RecordKind
from healthd.state_files import CorruptStateError, UnreadableContent, open_state_db, salvage_rows

JOURNAL_WHAT = "fault journal"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS faults (
  id TEXT PRIMARY KEY, state TEXT NOT NULL, check_name TEXT NOT NULL, code TEXT NOT NULL,
  gpu_uuid TEXT NOT NULL, severity INTEGER NOT NULL, action INTEGER NOT NULL, last_seq INTEGER NOT NULL,
  resolved_at REAL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS faults_state ON faults (state, last_seq);
CREATE TABLE IF NOT EXISTS records (
  seq INTEGER PRIMARY KEY, fault_id TEXT NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL, detail TEXT NOT NULL,
  data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
  target TEXT NOT NULL, seq INTEGER NOT NULL, fault_id TEXT NOT NULL, payload TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL DEFAULT 0, delivered_at REAL,
  last_error TEXT NOT NULL DEFAULT '', PRIMARY KEY (target, seq));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (target, delivered_at, seq);
CREATE TABLE IF NOT EXISTS fatal_boots (
  identity TEXT NOT NULL, boot_id TEXT NOT NULL, first_seen REAL NOT NULL, PRIMARY KEY (identity, boot_id));
"""


@dataclass(frozen=True, slots=True)
class Change:
    """One record to write: what happened to which fault, and the hook targets to queue it for."""

    kind: RecordKind
    fault: Fault
    detail: str = ""
    outbox_targets: tuple[str, ...] = ()


class JournalError(Exception):
    pass


class Journal:
    def __init__(self, path: Path) -> None:
        """Opens (or creates) the journal; raises CorruptStateError naming the file when it is damaged."""
        self.path = path
        self._lock = threading.Lock()
        self._db = open_state_db(path, JOURNAL_WHAT, SCHEMA, corrupt_journal, self._read_last_seq, timeout=30.0)

    def _read_last_seq(self, db: sqlite3.Connection) -> None:
        row = db.execute("SELECT value FROM meta WHERE key='last_seq'").fetchone()
        max_row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()
        try:
            self._last_seq = max(int(row[0]) if row else 0, int(max_row[0]))
        except ValueError as exc:  # meta.last_seq that is not a number
            raise UnreadableContent(f"meta.last_seq: {exc}"[:200]) from None

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes ------------------------------------------------------------------------------------------------

    def commit(
        self,
        changes: Sequence[Change],
        at: float,
        *,
        touched: Iterable[Fault] = (),
        fatal_boots: Iterable[tuple[str, str]] = (),
    ) -> list[FaultRecord]:
        """Write records (with the next sequence numbers) plus silent state updates, in one transaction.

        ``touched`` faults are stored without a record (e.g. a condition's last_seen). The faults in ``changes``
        are stored with ``last_seq`` set to their record's sequence number; the returned records carry them.
        ``fatal_boots`` are (identity, boot id) pairs: a fatal identity seen in that boot, noted at ``at``.
        """
        records: list[FaultRecord] = []
        with self._lock:
            seq = self._last_seq
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for identity, boot_id in fatal_boots:
                    self._db.execute(
                        "INSERT OR IGNORE INTO fatal_boots (identity, boot_id, first_seen) VALUES (?, ?, ?)",
                        (identity, boot_id, at),
                    )
                for fault in touched:
                    self._store_fault(fault)
                for change in changes:
                    seq += 1
                    fault = _with_seq(change.fault, seq)
                    self._store_fault(fault)
                    data = fault.dumps()
                    self._db.execute(
                        "INSERT INTO records (seq, fault_id, kind, at, detail, data) VALUES (?, ?, ?, ?, ?, ?)",
                        (seq, fault.id, change.kind.value, at, change.detail, data),
                    )
                    for target in change.outbox_targets:
                        self._db.execute(
                            "INSERT INTO outbox (target, seq, fault_id, payload) VALUES (?, ?, ?, ?)",
                            (target, seq, fault.id, data),
                        )
                    records.append(FaultRecord(seq, change.kind, at, fault, change.detail))
                if seq != self._last_seq:
                    self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_seq', ?)", (str(seq),))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._last_seq = seq
        return records

    def _store_fault(self, f: Fault) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO faults (id, state, check_name, code, gpu_uuid, severity, action, last_seq,"
            " resolved_at, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                f.id,
                f.state.value,
                f.check,
                f.code,
                f.gpu.uuid if f.gpu else "",
                int(f.severity),
                int(f.action),
                f.last_seq,
                f.resolved_at,
                f.dumps(),
            ),
        )

    def fatal_boots(self, identity: str, boot_id: str, since: float) -> tuple[int, bool]:
        """In how many boots since ``since`` a fatal identity was seen, and whether ``boot_id`` is noted already."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(first_seen >= ?), 0), COALESCE(SUM(boot_id = ?), 0) FROM fatal_boots"
                " WHERE identity = ?",
                (since, boot_id, identity),
            ).fetchone()
        return int(row[0]), bool(row[1])

    def prune(self, now: float, max_age_seconds: float, max_resolved: int, max_records: int | None = None) -> int:
        """Drop resolved faults and records older than the retention, resolved faults beyond their count, and the
        oldest records and delivered hook items beyond ``max_records`` (a card that flaps for weeks)."""
        cutoff = now - max_age_seconds
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                n = self._db.execute(
                    "DELETE FROM faults WHERE state = 'resolved' AND resolved_at < ?", (cutoff,)
                ).rowcount
                n += self._db.execute(
                    "DELETE FROM faults WHERE state = 'resolved' AND id NOT IN (SELECT id FROM faults"
                    " WHERE state = 'resolved' ORDER BY last_seq DESC LIMIT ?)",
                    (max_resolved,),
                ).rowcount
                self._db.execute("DELETE FROM records WHERE at < ?", (cutoff,))
                self._db.execute("DELETE FROM outbox WHERE delivered_at IS NOT NULL AND delivered_at < ?", (cutoff,))
                self._db.execute("DELETE FROM fatal_boots WHERE first_seen < ?", (cutoff,))
                if max_records is not None:
                    self._db.execute(
                        "DELETE FROM records WHERE seq <= (SELECT MAX(seq) FROM records) - ?", (max_records,)
                    )
                    self._db.execute(
                        "DELETE FROM outbox WHERE delivered_at IS NOT NULL AND seq <= "
                        "(SELECT MAX(seq) FROM outbox WHERE delivered_at IS NOT NULL) - ?",
                        (max_records,),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return n

    # -- reads -------------------------------------------------------------------------------------------------

    def active_faults(self) -> list[Fault]:
        with self._lock:
            rows = self._db.execute("SELECT data FROM faults WHERE state = 'active' ORDER BY last_seq").fetchall()
        return [Fault.from_json(json.loads(r[0])) for r in rows]

    def list_faults(self, flt: FaultFilter) -> list[Fault]:
        sql = "SELECT data FROM faults WHERE last_seq > ?"
        args: list[object] = [flt.since_seq]
        if flt.state is not None:
            sql += " AND state = ?"
            args.append(flt.state.value)
        if flt.check:
            sql += " AND check_name = ?"
            args.append(flt.check)
        if flt.min_severity is not None:
            sql += " AND severity >= ?"
            args.append(int(flt.min_severity))
        if flt.min_action is not None:
            sql += " AND action >= ?"
            args.append(int(flt.min_action))
        sql += " ORDER BY last_seq"
        out: list[Fault] = []
        with self._lock:
            cursor = self._db.execute(sql, args)
            for (data,) in cursor:
                fault = Fault.from_json(json.loads(data))
                if flt.matches(fault):
                    out.append(fault)
                    if len(out) >= flt.limit:
                        break
        return out

    def records_after(self, seq: int, limit: int) -> list[FaultRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, at, detail, data FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
            ).fetchall()
        return [
            FaultRecord(int(s), RecordKind(k), float(at), Fault.from_json(json.loads(d)), detail)
            for s, k, at, detail, d in rows
        ]

    def first_retained_seq(self) -> int:
        """The oldest record still in the journal (last_seq + 1 when none is)."""
        with self._lock:
            row = self._db.execute("SELECT MIN(seq) FROM records").fetchone()
        return int(row[0]) if row[0] is not None else self._last_seq + 1

    # -- outbox ------------------------------------------------------------------------------------------------

    def outbox_head(self, target: str) -> OutboxItem | None:
        """The oldest undelivered item for a target: delivery is strictly in sequence order."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, fault_id, payload, attempts, next_attempt_at, last_error FROM outbox"
                " WHERE target = ? AND delivered_at IS NULL ORDER BY seq LIMIT 1",
                (target,),
            ).fetchone()
        if row is None:
            return None
        return OutboxItem(target, int(row[0]), row[1], row[2], int(row[3]), float(row[4]), row[5])

    def outbox_delivered(self, target: str, seq: int, at: float) -> None:
        with self._lock:
            self._db.execute("UPDATE outbox SET delivered_at = ? WHERE target = ? AND seq = ?", (at, target, seq))

    def outbox_failed(self, target: str, seq: int, next_attempt_at: float, error: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
                " WHERE target = ? AND seq = ?",
                (next_attempt_at, error[:1000], target, seq),
            )

    def outbox_deliveries(self) -> tuple[HookDelivery, ...]:
        """The newest outbox row of every (target, fault) still kept (delivered rows leave with retention)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT target, fault_id, MAX(seq), delivered_at, attempts, last_error FROM outbox"
                " GROUP BY target, fault_id ORDER BY target, fault_id"
            ).fetchall()
        return tuple(
            HookDelivery(target, fault, int(seq), None if at is None else float(at), int(tries), error)
            for target, fault, seq, at, tries, error in rows
        )

    def outbox_depth(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT target, COUNT(*) FROM outbox WHERE delivered_at IS NULL GROUP BY target"
            ).fetchall()
        return {t: int(n) for t, n in rows}


def _with_seq(fault: Fault, seq: int) -> Fault:
    return replace(fault, last_seq=seq)


def corrupt_journal(path: Path, reason: str) -> CorruptStateError:
    """The error for a damaged journal, with what moving it aside loses."""
    active = salvage_rows(path, "SELECT COUNT(*) FROM faults NOT INDEXED WHERE state != 'resolved'")
    pending = salvage_rows(path, "SELECT COUNT(*) FROM outbox NOT INDEXED WHERE delivered_at IS NULL")
    held = []
    if active is not None:
        held.append(f"{active[0][0]} open faults")
    if pending is not None:
        held.append(f"{pending[0][0]} hook deliveries not yet acknowledged")
    known = f" (it still shows {' and '.join(held)})" if held else ""
    return CorruptStateError(
        path,
        what=JOURNAL_WHAT,
        kind="faults",
        reason=reason,
        lost=(
            f"Moving it aside loses the fault history{known}, the hook deliveries still queued and the "
            "reboot counts that escalate repeated fatal faults; WatchFaults sequence numbers start again at 1. "
            "Conditions that still hold are found again by the probes; past XID events are not."
        ),
    )
