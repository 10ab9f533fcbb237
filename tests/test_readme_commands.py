"""Every shell command in README.md's code blocks, run as written against a real daemon on the simulated node.

The daemon is this test's own (a free port, a socket under tmp), so the commands get three substitutions, and
nothing else: ``localhost:9410`` becomes the daemon's metrics address, ``/tmp/xpu-hook`` a path under tmp, and the
placeholders ``ID`` and ``FAULT_ID`` the partition and fault that the commands before them made (``train.py`` is a
one-line Python that checks it runs inside the partition). ``./dev xpuctl`` reaches the daemon through XPU_SOCKET,
as it does for ``./dev run``. The commands in NOT_RUN are not run here, for the reason given; the ones in
BACKGROUND serve or stream until stopped, so they count as working when they are still up after a while, having
printed no error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

README = REPO / "README.md"
NOT_RUN = {
    "./dev run": "starts the daemon on :9410 with .run/ (another one may be up); the test runs its own instead",
    "./dev test": "the test suite itself",
}
BACKGROUND = ("./dev xpuctl faults watch", "./dev xpuctl hook serve")
TRAIN = 'python3 -c \'import os; assert os.environ["CUDA_VISIBLE_DEVICES"].startswith("GPU-")\''


def readme_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each line of an indented code block (4 spaces after a blank line) or a fenced
    ``sh`` block."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    in_block = fenced = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced and line.strip() in ("```sh", "```bash")
            continue
        previous = lines[number - 2] if number > 1 else ""
        if fenced or (line.startswith("    ") and line.strip() and (in_block or not previous.strip())):
            in_block = not fenced
            found.append((number, line.strip()))
        else:
            in_block = False
    return found


def _venv_ready() -> bool:
    stamp = REPO / ".venv" / ".installed"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    return stamp.exists() and stamp.read_text().strip() == want


def _ids(env: dict[str, str], what: str) -> str:
    command = ["partitions", "list"] if what == "partition" else ["faults", "list", "--state", "active"]
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", *command, "--json"], env=env, capture_output=True, text=True, check=True
    )
    items = json.loads(out.stdout)["partitions" if what == "partition" else "faults"]
    assert items, f"no {what} for the README's placeholder"
    return str(items[0]["id"])


def test_the_readme_command_list_is_read() -> None:
    commands = [c for _, c in readme_commands(README.read_text())]
    assert "./dev run" in commands and "./dev xpuctl partitions list" in commands
    assert all(c.startswith(("./dev ", "curl ")) for c in commands), commands


@pytest.mark.skipif(not _venv_ready(), reason="./dev has not set up .venv for this pyproject.toml here")
def test_every_readme_command_works(tmp_path: Path) -> None:
    hook_dir = tmp_path / "xpu-hook"
    # [hook] as packaging/examples/hook.toml has it (at this test's path), retrying within a second
    config = f'[hook]\nendpoints = ["unix:{hook_dir}.sock"]\nbackoff_max_seconds = 1\n'
    background: list[tuple[str, subprocess.Popen[str]]] = []
    ran = 0
    with DaemonProcess(tmp_path, extra_config=config) as d:
        env = {**os.environ, "XPU_SOCKET": d.address, "XPU_HOOK_SPOOL": str(hook_dir)}
        env.pop("XPU_ADMIN_SOCKET", None)
        try:
            for number, command in readme_commands(README.read_text()):
                if any(command == c or command.startswith(c + " ") for c in NOT_RUN):
                    continue
                command = command.replace("localhost:9410", f"127.0.0.1:{d.port}").replace(
                    "/tmp/xpu-hook", str(hook_dir)
                )
                command = command.replace("python3 train.py", TRAIN)
                if re.search(r"\bFAULT_ID\b", command):
                    command = re.sub(r"\bFAULT_ID\b", _ids(env, "fault"), command)
                if re.search(r"\bID\b", command):
                    command = re.sub(r"\bID\b", _ids(env, "partition"), command)
                where = f"README.md:{number}: {command}"
                if command.startswith(BACKGROUND):
                    proc = subprocess.Popen(
                        ["bash", "-c", command], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True, start_new_session=True,
                    )  # fmt: skip
                    time.sleep(3)
                    assert proc.poll() is None, f"{where} ended: {proc.communicate()[1][-2000:]}"
                    background.append((where, proc))
                else:
                    out = subprocess.run(
                        ["bash", "-c", "set -o pipefail; " + command],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
                    )  # fmt: skip
                    assert out.returncode == 0, f"{where} exit {out.returncode}: {out.stderr[-2000:]}"
                ran += 1
            # the README's hook: the XID 79 it injected reaches the example command through the reference hook
            wait_until(lambda: any(hook_dir.glob("flt-*.json")) or None, "the fault in the hook's spool", 30, step=0.2)
        finally:
            for where, proc in background:
                os.killpg(proc.pid, 15)
                _, err = proc.communicate(timeout=30)
                assert "Traceback" not in err and "xpuctl:" not in err, f"{where}: {err[-2000:]}"
    assert ran >= 20
