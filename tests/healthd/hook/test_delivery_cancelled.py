"""The reference hook runs a fault's command once even when the daemon dies while the command runs."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_daemon_killed_mid_command_does_not_make_the_hook_run_it_twice(tmp_path: Path) -> None:
    hook_sock = tmp_path / "hook.sock"
    log = tmp_path / "commands.log"
    state = tmp_path / "hook.sqlite"
    command = f'echo "start-$XPU_FAULT_ID" >> {log}; sleep 2; echo "done-$XPU_FAULT_ID" >> {log}'
    hook = start_hook(f"unix:{hook_sock}", command, state)
    config = f'[hook]\nendpoints = ["unix:{hook_sock}"]\nbackoff_initial_seconds = 0.2\nbackoff_max_seconds = 1\n'
    try:
        first = DaemonProcess(tmp_path, extra_config=config).start()
        try:
            assert first.xpuctl("simulate", "inject", "xid", "--gpu", "3", "code=79").returncode == 0
            wait_until(lambda: len(_lines(log)) == 1, "the hook's command started", 30.0, step=0.05)
        finally:
            assert first.proc is not None
            first.proc.send_signal(signal.SIGKILL)  # 1 s or less into the 2 s command
            first.stop()
        fault_id = _lines(log)[0].removeprefix("start-")

        def execution() -> tuple[int, int, int | None]:
            with sqlite3.connect(state) as db:
                row = db.execute(
                    "SELECT runs, deliveries, exit_code FROM executions WHERE fault_id = ?", (fault_id,)
                ).fetchone()
            return (int(row[0]), int(row[1]), row[2])

        with DaemonProcess(tmp_path, extra_config=config) as again:  # delivers the fault again
            wait_until(lambda: execution()[1] >= 2 and execution()[2] == 0, "the redelivery answered", 30.0)
            wait_until(lambda: "hook outbox" not in again.get("/healthz")[1], "the outbox drained", 30.0)
            assert execution()[0] == 1, "the command ran once"
    finally:
        stop_hook(hook)
    assert _lines(log) == [f"start-{fault_id}", f"done-{fault_id}"], "one run, to its end"
