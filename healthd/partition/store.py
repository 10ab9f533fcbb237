"""Partition state in SQLite (WAL, synchronous=FULL): each change is one transaction, durable before we answer.

After a kill -9 the file holds every committed change and nothing half-written; the manager reconciles rows in
state ``creating``/``deleting`` with what the GPU and MPS actually have.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State

SCHEMA = """
CREATE TABLE IF NOT EXISTS cards (
    gpu_uuid TEXT PRIMARY KEY,
    mode TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    id TEXT PRIMARY KEY,
    gpu INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    mode TEXT NOT NULL,
    compute_percent INTEGER NOT NULL,
    memory_mib INTEGER NOT NULL,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL DEFAULT 0,
    request_id TEXT,
    request_fingerprint TEXT NOT NULL DEFAULT '',
    mig TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS partitions_request_id ON partitions(request_id) WHERE request_id IS NOT NULL;
"""


class Store:
    """Thread-safe (one connection behind a lock); every write commits before it returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        with self._lock:
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----- cards ---------------------------------------------------------------------------------------------

    def card_modes(self) -> dict[str, CardMode]:
        with self._lock:
            rows = self._db.execute("SELECT gpu_uuid, mode FROM cards").fetchall()
        return {uuid: CardMode(mode) for uuid, mode in rows}

    def set_card_mode(self, gpu_uuid: str, mode: CardMode) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO cards(gpu_uuid, mode) VALUES(?, ?) ON CONFLICT(gpu_uuid) DO UPDATE SET mode=excluded.mode",
                (gpu_uuid, mode.value),
            )

    # ----- partitions ----------------------------------------------------------------------------------------

    def insert(self, record: PartitionRecord) -> None:
        """Raises sqlite3.IntegrityError when the id or the request id is taken."""
        with self._lock:
            self._db.execute(
                "INSERT INTO partitions(id, gpu, gpu_uuid, mode, compute_percent, memory_mib, owner, state, created_at,"
                " lease_expires_at, request_id, request_fingerprint, mig) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                _row(record),
            )

    def update(self, record: PartitionRecord) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE partitions SET state=?, lease_expires_at=?, mig=? WHERE id=?",
                (record.state.value, record.lease_expires_at, _mig_json(record.mig), record.id),
            )

    def set_owner(self, record: PartitionRecord) -> None:
        """A new owner (and lease expiry) for an existing partition: the rebind of a kubelet device to its pod."""
        with self._lock:
            self._db.execute(
                "UPDATE partitions SET owner=?, lease_expires_at=? WHERE id=?",
                (json.dumps(asdict(record.owner), sort_keys=True), record.lease_expires_at, record.id),
            )

    def delete(self, partition_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM partitions WHERE id=?", (partition_id,))

    def get(self, partition_id: str) -> PartitionRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM partitions WHERE id=?", (partition_id,)).fetchone()
        return _record(row) if row else None

    def by_request_id(self, request_id: str) -> PartitionRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM partitions WHERE request_id=?", (request_id,)).fetchone()
        return _record(row) if row else None

    def all(self) -> list[PartitionRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM partitions ORDER BY created_at, id").fetchall()
        return [_record(r) for r in rows]


_COLUMNS = (
    "id, gpu, gpu_uuid, mode, compute_percent, memory_mib, owner, state, created_at, lease_expires_at, request_id,"
    " request_fingerprint, mig"
)


def _mig_json(mig: MigPlacement | None) -> str | None:
    return json.dumps(asdict(mig), sort_keys=True) if mig else None


def _row(r: PartitionRecord) -> tuple[Any, ...]:
    return (
        r.id,
        r.gpu,
        r.gpu_uuid,
        r.mode.value,
        r.compute_percent,
        r.memory_mib,
        json.dumps(asdict(r.owner), sort_keys=True),
        r.state.value,
        r.created_at,
        r.lease_expires_at,
        r.request_id or None,
        r.request_fingerprint,
        _mig_json(r.mig),
    )


def _record(row: tuple[Any, ...]) -> PartitionRecord:
    owner_raw = json.loads(row[6])
    owner_raw["kind"] = OwnerKind(owner_raw["kind"])
    mig_raw = json.loads(row[12]) if row[12] else None
    return PartitionRecord(
        id=row[0],
        gpu=row[1],
        gpu_uuid=row[2],
        mode=CardMode(row[3]),
        compute_percent=row[4],
        memory_mib=row[5],
        owner=Owner(**owner_raw),
        state=State(row[7]),
        created_at=row[8],
        lease_expires_at=row[9],
        request_id=row[10] or "",
        request_fingerprint=row[11],
        mig=MigPlacement(**mig_raw) if mig_raw else None,
    )
