"""The reference hook server (`xpuctl hook serve`) on a unix socket, as a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def start_hook(
    listen: str, command: str, state: Path, *, log_level: str = "warning", extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Runs ``command`` for each fault reported to ``listen``; ``state`` is its SQLite file; ``extra``: more flags."""
    return subprocess.Popen(
        [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", listen, "--exec", command,
         "--state", str(state), "--log-level", log_level, *extra],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def stop_hook(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM; its exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)
