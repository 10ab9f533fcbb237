"""The NVML XID path survives a journal it cannot write for a while: nothing after the failure is lost.

An operator's ``sqlite3`` session holding the write lock past the journal's 30 s busy timeout (or a full state
file system) makes one commit fail. The XID event loop fails with it; its supervisor logs and counts that, shows
it in the node status and starts the loop again, which records the event it was holding and every later one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.exporter.collectors.test_card_metrics import value
from tests.support.daemon_process import DaemonProcess
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

LOCK_SECONDS = 40.0
LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def _active(d: DaemonProcess, gpu: int) -> bool:
    return "xid_79" in d.xpuctl("faults", "list", "--state", "active", "--gpu", str(gpu)).stdout


def test_an_xid_after_a_journal_locked_for_40s_is_recorded_and_reaches_the_hook(tmp_path: Path) -> None:
    hook_sock = tmp_path / "hook.sock"
    executed = tmp_path / "executed.txt"
    hook = start_hook(f"unix:{hook_sock}", f'echo "$XPU_FAULT_ID" >> {executed}', tmp_path / "hook.sqlite")
    config = f'[hook]\nendpoints = ["unix:{hook_sock}"]\nbackoff_initial_seconds = 0.2\nbackoff_max_seconds = 1\n'
    try:
        with DaemonProcess(tmp_path, extra_config=config) as d:
            locker = subprocess.Popen(
                [sys.executable, "-c", LOCKER, str(tmp_path / "state" / "faults.sqlite"), str(LOCK_SECONDS)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
            assert d.xpuctl("simulate", "inject", "xid", "--gpu", "1", "code=79").returncode == 0
            assert locker.wait(LOCK_SECONDS + 30) == 0
            locker.stdout.close()
            time.sleep(1.0)
            assert d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=79").returncode == 0

            wait_until(lambda: _active(d, 2), "the XID 79 injected after the lock recorded", 60.0, step=0.5)
            wait_until(lambda: _active(d, 1), "the XID 79 seen during the lock recorded too", 60.0, step=0.5)
            wait_until(
                lambda: executed.exists() and len(set(executed.read_text().split())) == 2,
                "both faults delivered to the hook, once each",
                60.0,
                step=0.5,
            )
            assert len(executed.read_text().split()) == 2
            assert (value(d.metrics(), "xpu_worker_restarts_total", worker="xid-nvml") or 0) >= 1
            code, body = d.get("/healthz")
            assert code == 200 and body.startswith("degraded") and "xid-nvml restarted" in body, body
            assert "database is locked" in d.log.read_text()
    finally:
        stop_hook(hook)
