"""Reboot escalation's notes are part of the journal commit that records the fatal finding: one write transaction
per fatal XID, and a note whose commit failed is written with the next one (so the boot still counts)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from healthd.faults.engine import FaultEngine
from healthd.faults.journal import Journal
from healthd.findings import Action, Severity
from tests.support.clock import FakeClock
from tests.support.faults_helpers import make_engine, xid

FATAL_XID = xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE)


def _statements(engine: FaultEngine) -> list[str]:
    """Every statement the journal's connection runs from now on (the engine's one writer)."""
    seen: list[str] = []
    engine.journal._db.set_trace_callback(seen.append)  # the connection is the journal's own
    return seen


def _transactions(statements: list[str]) -> list[list[str]]:
    """The writing statements, grouped by the transaction they ran in; a write outside one is its own group."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for sql in (s.strip().split()[0].upper() for s in statements):
        if sql == "BEGIN":
            current = []
        elif sql in ("COMMIT", "ROLLBACK"):
            if current is not None:
                groups.append(current)
            current = None
        elif sql in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
            if current is None:
                groups.append([sql])  # autocommit: a transaction (and an fsync) of its own
            else:
                current.append(sql)
    return [g for g in groups if g]


def _boots(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT identity, boot_id FROM fatal_boots").fetchall())


def test_a_fatal_xid_is_one_write_transaction(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock())
    statements = _statements(engine)
    (record,) = engine.accept_event(FATAL_XID)
    assert len(_transactions(statements)) == 1, statements
    assert _boots(tmp_path / "faults.sqlite") == [(record.fault.identity, "boot-1")]
    engine.journal.close()


def test_a_boot_note_whose_commit_failed_is_written_with_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tmp_path, FakeClock())
    real = Journal.commit

    def failing(self: Journal, *args: object, **kwargs: object) -> object:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Journal, "commit", failing)
    with pytest.raises(sqlite3.OperationalError):
        engine.accept_event(FATAL_XID)
    monkeypatch.setattr(Journal, "commit", real)
    (record,) = engine.accept_event(FATAL_XID)
    assert _boots(tmp_path / "faults.sqlite") == [(record.fault.identity, "boot-1")]
    engine.journal.close()


def test_each_boot_is_counted_once_and_the_third_escalates(tmp_path: Path) -> None:
    clock = FakeClock()
    actions = []
    for boot in ("boot-1", "boot-1", "boot-2", "boot-3"):  # a daemon restart within boot-1, then two reboots
        engine = make_engine(tmp_path, clock, boot_id=boot, escalation_reboots=2)
        records = engine.accept_event(FATAL_XID)
        actions.append(records[-1].fault.action if records else None)
        engine.journal.close()
        clock.advance(60)
    assert _boots(tmp_path / "faults.sqlite")[0][1:] == ("boot-1",)
    assert [b for _, b in _boots(tmp_path / "faults.sqlite")] == ["boot-1", "boot-2", "boot-3"]
    assert actions[-1] is Action.REPLACE_NODE
    assert Action.REPLACE_NODE not in actions[:-1]
