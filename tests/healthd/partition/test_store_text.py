"""A partition row whose text is no longer UTF-8 (a flipped byte that SQLite's quick check does not see) is
corruption: the store refuses it as such, so the documented --move-aside recovery moves the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from healthd.partition.model import CardMode, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.store import Store
from healthd.state_files import CorruptStateError, move_aside_if_corrupt


def test_a_row_that_is_not_utf8_is_corruption_and_can_be_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "partitions.sqlite"
    store = Store(path)
    owner = Owner(OwnerKind.LEASE, holder="h")
    store.insert(PartitionRecord("p-1", 4, "GPU-4", CardMode.TDM, 10, 0, owner, State.READY, 1.0, 2.0))
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE partitions SET owner = CAST(X'7bff22' AS TEXT)")  # '{', a byte no UTF-8 text has, '"'
    db.commit()
    db.close()
    with pytest.raises(CorruptStateError, match="a row cannot be read: Could not decode to UTF-8"):
        Store(path)
    moved = move_aside_if_corrupt(path, Store)
    assert moved is not None and moved[0].name.startswith("partitions.sqlite.corrupt-")
    assert not path.exists()
    Store(path).close()  # a fresh, empty state file opens
