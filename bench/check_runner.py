"""One step of the device check as a process: its own process group, its output in a log file, killed at its limit.

A step runs in a new session, so the kill reaches every process it started that stayed in its group (the daemons
it runs, their pytest or torch children). At the limit the group gets SIGTERM, then SIGKILL after a short grace.
The outcome records how long it ran against its limit and the last lines of its log. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL of a step's process group
TAIL_LINES = 8
TAIL_LINE_CHARS = 240


@dataclass
class Outcome:
    """What the summary says about one step. ``status``: ok, failed, killed, skipped, running or not run."""

    name: str
    title: str
    limit_s: float
    status: str = "not run"
    rc: int | None = None
    elapsed_s: float = 0.0
    reason: str = ""
    tail: list[str] = field(default_factory=list)
    figures: object = None

    @property
    def over_limit(self) -> bool:
        return self.status == "killed" or self.elapsed_s > self.limit_s


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of a log, each cut to a readable length."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
    return [line if len(line) <= TAIL_LINE_CHARS else line[: TAIL_LINE_CHARS - 3] + "..." for line in kept]


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_step(
    outcome: Outcome,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    limit_s: float,
    stop_requested: Callable[[], str | None],
    started: Callable[[int], None] = lambda pid: None,
) -> Outcome:
    """Run ``argv`` until it exits, ``limit_s`` passes, or ``stop_requested()`` names a reason to stop."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    outcome.status = "running"
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            outcome.status, outcome.reason = "failed", f"could not start: {exc}"
            return outcome
        started(proc.pid)
        why_stopped = ""
        while proc.poll() is None:
            if time.monotonic() - t0 >= limit_s:
                why_stopped = f"killed at its limit of {limit_s:g} s"
            elif (reason := stop_requested()) is not None:
                why_stopped = reason
            if why_stopped:
                kill_group(proc.pid)
                proc.wait()
                break
            time.sleep(0.05)
        kill_group(proc.pid)  # what the step left running in its group (a daemon it did not stop)
    outcome.elapsed_s = time.monotonic() - t0
    outcome.rc = proc.returncode
    outcome.tail = tail(log)
    if why_stopped:
        outcome.status, outcome.reason = "killed", why_stopped
    elif proc.returncode == 0:
        outcome.status = "ok"
    else:
        outcome.status, outcome.reason = "failed", f"exit status {proc.returncode}"
    return outcome


__all__ = ["Outcome", "kill_group", "run_step", "tail"]
