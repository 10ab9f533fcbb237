"""State files are not readable by other local users outside the packaged unit either: a daemon started with the
usual umask 022 (``./dev run``) on a directory that others may enter (the DaemonSet's hostPath, made 0755) leaves
nothing there that another user can read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess

pytestmark = pytest.mark.e2e


def test_state_dir_and_files_give_other_users_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # whatever this process's umask
    old = os.umask(0o022)
    try:
        daemon = DaemonProcess(tmp_path)
        daemon.start()
    finally:
        os.umask(old)
    try:
        files = {p.name: p for p in state.iterdir() if p.is_file()}
        assert {"faults.sqlite", "partitions.sqlite"} <= files.keys(), sorted(files)
        assert stat.S_IMODE(state.stat().st_mode) & 0o007 == 0, oct(state.stat().st_mode)
        for name, path in files.items():
            assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, (name, oct(path.stat().st_mode))
    finally:
        daemon.stop()
