"""Damaged SQLite state files: found at open, named with what moving them aside loses; move-aside keeps them."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from healthd.faults.journal import Journal
from healthd.hook.reference import ExecutionStore
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.store import Store
from healthd.state_files import CorruptStateError, StateFileError, move_aside


def _record(i: int, gpu: int, mode: CardMode) -> PartitionRecord:
    return PartitionRecord(
        id=f"part-{i:04d}-" + "x" * 40,
        gpu=gpu,
        gpu_uuid=f"GPU-{gpu}",
        mode=mode,
        compute_percent=25,
        memory_mib=4096,
        owner=Owner(OwnerKind.LEASE),
        state=State.READY,
        created_at=float(i),
        lease_expires_at=1e10,
        request_id=f"req-{i}-" + "y" * 40,
        mig=MigPlacement(9, "3g.71gb", 0, 4) if mode is CardMode.MIG else None,
    )


def _partitions(path: Path) -> None:
    """Three TDM partitions on GPU 4 and 200 MIG ones on GPU 6, card modes for both: enough for several pages."""
    store = Store(path)
    for i in range(3):
        store.insert(_record(i, 4, CardMode.TDM))
    for i in range(3, 203):
        store.insert(_record(i, 6, CardMode.MIG))
    store.set_card_mode("GPU-4", CardMode.TDM)
    store.set_card_mode("GPU-6", CardMode.MIG)
    store.close()


def _damage_index(path: Path, index: str) -> None:
    """Overwrite the b-tree page header of one index, as a torn write or a bad sector would."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
    db.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\x0d\x00\x05" + b"\xa5" * 29)


def test_a_damaged_partition_file_is_refused_with_what_it_still_shows(tmp_path: Path) -> None:
    path = tmp_path / "partitions.sqlite"
    _partitions(path)
    _damage_index(path, "partitions_request_id")
    with pytest.raises(CorruptStateError) as caught:
        Store(path)
    exc = caught.value
    assert (exc.path, exc.kind) == (path, "partitions")
    message = str(exc)
    assert message.startswith(f"partition state {path} is corrupt (integrity check failed: Page ")
    assert "It records 203 partitions (200 MIG on GPU 6; 3 TDM on GPU 4) and the TDM/MIG mode of 2 cards." in message
    assert "MPS control daemons keep running" in message and "MIG instances stay on the cards" in message


def test_garbage_is_refused_and_says_nothing_can_be_read(tmp_path: Path) -> None:
    path = tmp_path / "partitions.sqlite"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(CorruptStateError, match="cannot be read, so how many it recorded is unknown"):
        Store(path)


def test_a_row_the_daemon_cannot_decode_is_corruption_too(tmp_path: Path) -> None:
    path = tmp_path / "partitions.sqlite"
    _partitions(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE partitions SET owner = '{not json' WHERE gpu = 4")
    db.commit()
    db.close()
    with pytest.raises(CorruptStateError, match="a row cannot be read"):
        Store(path)


def test_a_file_sqlite_cannot_open_is_not_called_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "partitions.sqlite"
    path.mkdir()  # EISDIR: not damage, and moving it aside would not help
    with pytest.raises(StateFileError) as caught:
        Store(path)
    assert not isinstance(caught.value, CorruptStateError)
    assert str(caught.value).startswith(f"partition state {path}: cannot open it")


def test_a_damaged_journal_says_what_goes_with_it(tmp_path: Path) -> None:
    path = tmp_path / "faults.sqlite"
    Journal(path).close()
    _damage_index(path, "faults_state")
    with pytest.raises(CorruptStateError) as caught:
        Journal(path)
    assert caught.value.kind == "faults"
    text = str(caught.value)
    assert text.startswith(f"fault journal {path} is corrupt")
    assert "it still shows 0 open faults and 0 hook deliveries not yet acknowledged" in text
    assert "fault history" in text


def test_the_hook_file_and_its_move_aside_command(tmp_path: Path) -> None:
    path = tmp_path / "hook.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4080))  # the right magic, garbage after it
    with pytest.raises(CorruptStateError, match="runs its command again"):
        ExecutionStore(path)

    def xpuctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "healthd.cli", "hook", *args], capture_output=True, text=True, timeout=60
        )

    serve = xpuctl("serve", "--listen", f"unix:{tmp_path}/hook.sock", "--exec", "true", "--state", str(path))
    assert serve.returncode == 2
    assert len(serve.stderr.splitlines()) == 1, serve.stderr
    assert f"hook state {path} is corrupt" in serve.stderr
    assert f"xpuctl hook move-aside --state {path}" in serve.stderr
    moved = xpuctl("move-aside", "--state", str(path))
    assert moved.returncode == 0, moved.stderr
    assert not path.exists() and len(list(tmp_path.glob("hook.sqlite.corrupt-*"))) == 1
    ExecutionStore(path).close()  # starts afresh
    again = xpuctl("move-aside", "--state", str(path))
    assert again.returncode == 2 and "readable, nothing moved" in again.stderr


def test_move_aside_takes_the_wal_files_along_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "faults.sqlite"
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).write_text(suffix or "main")
    first = move_aside(path, now=0.0)
    assert [p.name for p in first] == [
        "faults.sqlite.corrupt-19700101T000000Z",
        "faults.sqlite.corrupt-19700101T000000Z-wal",
        "faults.sqlite.corrupt-19700101T000000Z-shm",
    ]
    assert first[1].read_text() == "-wal"
    path.write_text("second")
    second = move_aside(path, now=0.0)  # same second: a new name, the first copy stays
    assert [p.name for p in second] == ["faults.sqlite.corrupt-19700101T000000Z.2"]
    assert first[0].read_text() == "main" and second[0].read_text() == "second"
