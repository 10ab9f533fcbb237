"""Damage SQLite would open as "no data" (a zero-byte state file, a WAL whose header is overwritten) stops the start
like any other corruption: one line naming the file, exit 2, and ``--move-aside`` as the way out. A WAL with a
torn last frame (what a crash mid-write leaves) still starts with the commits before it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from healthd.faults.journal import Journal
from healthd.partition.store import Store
from tests.healthd.daemon.test_startup_errors import healthd_process, one_line_failure
from tests.support.daemon_process import DaemonProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("name", "kind"), [("faults.sqlite", "faults"), ("partitions.sqlite", "partitions")])
def test_a_zero_byte_state_file_is_refused_not_opened_empty(tmp_path: Path, name: str, kind: str) -> None:
    state = tmp_path / "state"
    with DaemonProcess(tmp_path):
        pass  # the daemon creates both files
    (state / name).write_bytes(b"")  # truncated by a full disk, a bad restore, a stray `> file`
    for companion in ("-wal", "-shm"):
        (state / (name + companion)).unlink(missing_ok=True)
    one_line_failure(
        healthd_process(tmp_path, "--simulate", "--state-dir", str(state)),
        str(state / name),
        "corrupt",
        "empty (0 bytes)",
        f"--move-aside {kind}",
    )
    moved = healthd_process(tmp_path, "--state-dir", str(state), "--move-aside", kind, sockets=False)
    assert moved.returncode == 0, moved.stderr
    assert len(list(state.glob(f"{name}.corrupt-*"))) == 1


def _faults_only_in_the_wal(tmp_path: Path) -> Path:
    """A daemon with three faults in its journal, killed (-9) before any checkpoint: they live in the WAL."""
    d = DaemonProcess(tmp_path).start()
    try:
        for gpu in (1, 2, 3):
            assert d.xpuctl("simulate", "inject", "xid", "--gpu", str(gpu), "code=79").returncode == 0
        wait_until(lambda: d.xpuctl("faults", "list").stdout.count("xid_79") == 3, "three faults", 20.0)
    finally:
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)
        d.stop()
    wal = tmp_path / "state" / "faults.sqlite-wal"
    assert wal.stat().st_size > 32, "the faults are in the WAL"
    return wal


def test_a_wal_with_an_overwritten_header_is_refused(tmp_path: Path) -> None:
    wal = _faults_only_in_the_wal(tmp_path)
    data = bytearray(wal.read_bytes())
    data[:4096] = os.urandom(4096)
    wal.write_bytes(bytes(data))
    state = tmp_path / "state"
    one_line_failure(
        healthd_process(tmp_path, "--simulate", "--state-dir", str(state)),
        str(state / "faults.sqlite"),
        "corrupt",
        "write-ahead log",
        "--move-aside faults",
    )
    with pytest.raises(Exception, match="write-ahead log"):
        Journal(state / "faults.sqlite")


def test_a_torn_wal_tail_still_starts_with_the_commits_before_it(tmp_path: Path) -> None:
    wal = _faults_only_in_the_wal(tmp_path)
    with wal.open("r+b") as f:
        f.truncate(wal.stat().st_size - 100)  # the last frame torn
    with DaemonProcess(tmp_path) as d:
        assert d.xpuctl("faults", "list").stdout.count("xid_79") >= 2


def test_a_new_state_directory_and_an_empty_wal_are_fine(tmp_path: Path) -> None:
    Store(tmp_path / "p.sqlite").close()
    (tmp_path / "p.sqlite-wal").write_bytes(b"")
    Store(tmp_path / "p.sqlite").close()
