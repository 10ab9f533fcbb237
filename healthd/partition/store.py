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
from healthd.state_files import CorruptStateError, UnreadableContent, open_state_db, salvage_rows

WHAT = "partition state"

SCHEMA = """
CREATE TABLE IF NOT EXISTS cards (
    gpu_uuid TEXT PRIMARY KEY,
    mode TEXT NOT NULL,
    sharing TEXT NOT NULL DEFAULT ''
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
    mig TEXT,
    client_uid INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS partitions_request_id ON partitions(request_id) WHERE request_id IS NOT NULL;
"""


class Store:
    """Thread-safe (one connection behind a lock); every write commits before it returns."""

    def __init__(self, path: Path) -> None:
        """Opens (or creates) the file; raises CorruptStateError when it is damaged or holds rows we cannot read."""
        self.path = path
        self._lock = threading.Lock()
        self._db = open_state_db(path, WHAT, SCHEMA, corrupt, self._upgrade_and_check)

    def _upgrade_and_check(self, db: sqlite3.Connection) -> None:
        columns = {row[1] for row in db.execute("PRAGMA table_info(cards)")}
        if "sharing" not in columns:  # a state file from before TDM sharing policies
            db.execute("ALTER TABLE cards ADD COLUMN sharing TEXT NOT NULL DEFAULT ''")
        if "client_uid" not in {row[1] for row in db.execute("PRAGMA table_info(partitions)")}:
            db.execute("ALTER TABLE partitions ADD COLUMN client_uid INTEGER")  # from before client uids: none given
        self._db = db
        try:  # every row must decode: the manager reads them all at start
            self.card_modes()
            self.all()
        except (ValueError, KeyError, TypeError) as exc:  # a row that does not decode (bad JSON, mode, owner)
            raise UnreadableContent(f"a row cannot be read: {exc!r}"[:200]) from None
        except sqlite3.OperationalError as exc:  # text that is no longer UTF-8 (a flipped byte the check missed)
            if "decode" not in str(exc):
                raise
            raise UnreadableContent(f"a row cannot be read: {exc}"[:200]) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----- cards ---------------------------------------------------------------------------------------------

    def card_modes(self) -> dict[str, tuple[CardMode, str]]:
        """Card uuid -> (mode, TDM sharing policy name; "" when none was stored)."""
        with self._lock:
            rows = self._db.execute("SELECT gpu_uuid, mode, sharing FROM cards").fetchall()
        return {uuid: (CardMode(mode), sharing) for uuid, mode, sharing in rows}

    def set_card_mode(self, gpu_uuid: str, mode: CardMode, sharing: str = "") -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO cards(gpu_uuid, mode, sharing) VALUES(?, ?, ?) ON CONFLICT(gpu_uuid) DO UPDATE SET"
                " mode=excluded.mode, sharing=excluded.sharing",
                (gpu_uuid, mode.value, sharing),
            )

    # ----- partitions ----------------------------------------------------------------------------------------

    def insert(self, record: PartitionRecord) -> None:
        """Raises sqlite3.IntegrityError when the id or the request id is taken."""
        with self._lock:
            self._db.execute(
                f"INSERT INTO partitions({_COLUMNS}) VALUES({_PLACEHOLDERS})",
                _row(record),
            )

    def update(self, record: PartitionRecord) -> None:
        """What changes over a partition's life: state, owner (a kubelet device rebound to its pod), lease, MIG."""
        with self._lock:
            self._db.execute(
                "UPDATE partitions SET state=?, owner=?, lease_expires_at=?, mig=? WHERE id=?",
                (
                    record.state.value,
                    _owner_json(record.owner),
                    record.lease_expires_at,
                    _mig_json(record.mig),
                    record.id,
                ),
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
    " request_fingerprint, mig, client_uid"
)
_PLACEHOLDERS = ", ".join("?" for _ in _COLUMNS.split(","))


def _owner_json(owner: Owner) -> str:
    return json.dumps(asdict(owner), sort_keys=True)


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
        _owner_json(r.owner),
        r.state.value,
        r.created_at,
        r.lease_expires_at,
        r.request_id or None,
        r.request_fingerprint,
        _mig_json(r.mig),
        r.client_uid,
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
        client_uid=row[13],
    )


def corrupt(path: Path, reason: str) -> CorruptStateError:
    """The error for a damaged partitions file, with what moving it aside would lose."""
    return CorruptStateError(path, what=WHAT, kind="partitions", reason=reason, lost=describe_loss(path))


def describe_loss(path: Path) -> str:
    """What the daemon forgets if the file goes: the partitions and card modes it can still read, and what stays."""
    rows = salvage_rows(path, "SELECT gpu, mode FROM partitions NOT INDEXED")
    cards = salvage_rows(path, "SELECT mode FROM cards NOT INDEXED")
    if rows is None and cards is None:
        held = "Its partitions cannot be read, so how many it recorded is unknown."
    else:
        per_mode: dict[str, list[int]] = {}
        for gpu, mode in rows or []:
            per_mode.setdefault(str(mode).upper(), []).append(int(gpu) if isinstance(gpu, int) else -1)
        parts = [f"{len(g)} {m} on GPU {','.join(str(i) for i in sorted(set(g)))}" for m, g in sorted(per_mode.items())]
        counted = f"{len(rows)} partition{'s' if len(rows) != 1 else ''}" if rows is not None else "unknown partitions"
        modes = sum(1 for (m,) in cards or [] if m != "none")
        held = f"It records {counted}" + (f" ({'; '.join(parts)})" if parts else "")
        held += f" and the TDM/MIG mode of {modes} card{'s' if modes != 1 else ''}." if cards is not None else "."
    return (
        f"{held} Moving it aside forgets them: their MPS control daemons keep running unsupervised, their MIG "
        "instances stay on the cards as foreign instances (left alone, never reused), their CDI devices are "
        "dropped, and the cards start with no partition mode; running workloads keep their GPUs."
    )
