"""xpuctl's output side: a reader that goes away early, and `xpuctl web hash-password`."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml

from exporter.webconfig import BasicAuthenticator, load_web_config
from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

pytestmark = pytest.mark.e2e

ROOT = REPO


def xpuctl_into_closed_pipe(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Like ``xpuctl ... | head -0``: the reading end is closed before xpuctl writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "healthd.cli", "--socket", socket, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write_end)


COMMANDS = [
    ("partitions", "list"),
    ("faults", "list"),
    ("faults", "watch", "--after", "0"),  # a stream: ends at the first write
    ("health",),
    ("topology",),
    ("topology", "--preferred", "2"),
    ("simulate", "kinds"),
    ("--help",),
    ("partitions", "--help"),
]


def test_a_reader_that_goes_away_ends_every_command_quietly(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        assert d.xpuctl("partitions", "mode", "4", "tdm").returncode == 0
        for i in range(3):
            out = d.xpuctl("partitions", "create", "--gpu", "4", "--compute", "10", "--memory", "1GiB")
            assert out.returncode == 0, (i, out.stderr)
        d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=13")
        for command in COMMANDS:
            out = xpuctl_into_closed_pipe(d.address, *command)
            assert out.stderr == "", (command, out.stderr)
            if "--help" in command:  # argparse itself drops a failed write of the help text and exits 0
                assert out.returncode in (0, 141), (command, out.returncode)
            else:
                assert out.returncode == 141, (command, out.returncode)  # 128 + SIGPIPE, as `head` users expect


def test_hash_password_makes_a_hash_the_web_config_accepts(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "web", "hash-password", "--cost", "5"],
        input="correct horse\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    hashed = out.stdout.strip()
    assert "\n" not in hashed and hashed.startswith("$2b$05$")
    assert bcrypt.checkpw(b"correct horse", hashed.encode())
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    config = load_web_config(web)
    auth = BasicAuthenticator(config.basic_auth_users)

    def header(password: str) -> str:
        return "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()

    assert auth.check(header("correct horse"))
    assert not auth.check(header("correct horse "))


@pytest.mark.parametrize(
    ("stdin", "args", "error"),
    [
        ("\n", (), "empty"),
        ("x" * 73 + "\n", (), "at most 72"),
        ("pw\n", ("--cost", "3"), "--cost"),
    ],
)
def test_hash_password_refuses_what_bcrypt_cannot_honour(stdin: str, args: tuple[str, ...], error: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "web", "hash-password", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert error in out.stderr and len(out.stderr.splitlines()) == 1
