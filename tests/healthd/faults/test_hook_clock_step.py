"""A backward wall-clock step (an RTC in local time corrected by NTP at boot) does not delay hook deliveries."""

from __future__ import annotations

import time
from pathlib import Path

from healthd.faults.settings import HookSettings
from healthd.findings import Action, Severity
from tests.support.faults_helpers import GPU0, DaemonThread, xid
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until


class SteppedClock:
    """The wall clock, plus an offset the test steps."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def test_a_clock_stepped_back_does_not_hold_a_queued_delivery(tmp_path: Path) -> None:
    hook_sock = tmp_path / "hook.sock"
    executed = tmp_path / "executed.txt"
    hook = HookSettings(endpoints=(f"unix:{hook_sock}",), backoff_initial_seconds=0.5, backoff_max_seconds=1.0)
    clock = SteppedClock()
    with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook, clock=clock) as d:
        d.engine.accept_event(xid(79, GPU0, severity=Severity.FATAL, action=Action.REPLACE_NODE))
        target = hook.endpoints[0]
        wait_until(lambda: d.health.dispatcher.failures[target] >= 2, "deliveries failing while the hook is down")
        clock.offset = -120.0  # the wall clock steps back two minutes between two attempts
        proc = start_hook(f"unix:{hook_sock}", f'echo "$XPU_FAULT_ID" >> {executed}', tmp_path / "hook.sqlite")
        try:
            # the back-off is at most 1 s: without the step the fault is delivered within seconds of the hook
            wait_until(lambda: d.engine.journal.outbox_depth() == {}, "the delivery after the step", limit=20)
        finally:
            stop_hook(proc)
    assert len(executed.read_text().split()) == 1


def test_a_stored_retry_time_far_ahead_is_trusted_only_up_to_the_longest_backoff(tmp_path: Path) -> None:
    hook_sock = tmp_path / "hook.sock"
    hook = HookSettings(endpoints=(f"unix:{hook_sock}",), backoff_initial_seconds=0.5, backoff_max_seconds=1.0)
    clock = SteppedClock()
    with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook, clock=clock) as d:
        d.engine.accept_event(xid(79, GPU0, severity=Severity.FATAL, action=Action.REPLACE_NODE))
        wait_until(lambda: d.health.dispatcher.failures[hook.endpoints[0]] >= 1, "a failed delivery")
    clock.offset = -3600.0  # the daemon restarts with its clock an hour behind the stored retry time
    proc = start_hook(f"unix:{hook_sock}", "true", tmp_path / "hook.sqlite")
    try:
        with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook, clock=clock) as d:
            wait_until(lambda: d.engine.journal.outbox_depth() == {}, "the delivery after the restart", limit=20)
    finally:
        stop_hook(proc)
