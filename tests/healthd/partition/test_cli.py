"""xpuctl partitions against a real gRPC server: create/list/capacity/delete and exec with the partition's env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from healthd.cli import main
from tests.support.partition_node import Daemon
from tests.support.paths import REPO


def xpuctl(daemon: Daemon, *args: str) -> list[str]:
    return ["--socket", daemon.read, "partitions", "--admin-socket", daemon.admin, *args]


def test_create_list_exec_delete(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(xpuctl(daemon, "mode", "5", "tdm")) == 0
    assert "mode tdm" in capsys.readouterr().out
    assert main(xpuctl(daemon, "create", "--gpu", "5", "--compute", "25", "--memory", "2GiB", "--json")) == 0
    out = capsys.readouterr().out
    created = json.JSONDecoder().raw_decode(out[out.index("{\n") :])[0]  # the server's log lines share stdout
    assert created["computePercent"] == 25
    assert main(xpuctl(daemon, "capacity", "--gpu", "5")) == 0
    assert "25%" in capsys.readouterr().out
    assert main(xpuctl(daemon, "create", "--gpu", "5", "--compute", "80")) == 1
    assert "RESOURCE_EXHAUSTED" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # checked by xpuctl before anything is sent
        main(xpuctl(daemon, "create", "--gpu", "5", "--memory", "100MiB"))
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "xpuctl partitions create: argument --memory: '100MiB' is not a multiple of 128 MiB "
        "(see xpuctl partitions create --help)"
    ]

    # exec replaces the process: run it as a child and read the environment it got
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "healthd.cli",
            *xpuctl(
                daemon,
                "exec",
                created["id"],
                "--",
                sys.executable,
                "-c",
                "import os, json; "
                "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('CUDA', 'NVIDIA'))}))",
            ),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G"
    assert env["CUDA_VISIBLE_DEVICES"] == created["gpuUuid"]
    assert Path(env["CUDA_MPS_PIPE_DIRECTORY"]).is_dir()

    assert main(xpuctl(daemon, "delete", created["id"])) == 0
    assert "deleted" in capsys.readouterr().out
    assert main(xpuctl(daemon, "exec", created["id"], "--", "true")) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_writes_through_the_read_socket_are_refused(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--socket", daemon.read, "partitions", "--admin-socket", daemon.read, "mode", "5", "none"]
    assert main(args) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err


def test_create_with_a_client_uid_on_a_shared_card(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    """--uid reaches the daemon; a second uid on a shared card is refused with the reason, on stderr."""
    assert main(xpuctl(daemon, "mode", "4", "tdm", "--sharing", "shared")) == 0
    capsys.readouterr()
    assert main(xpuctl(daemon, "create", "--gpu", "4", "--compute", "10", "--uid", "1000", "--json")) == 0
    out = capsys.readouterr().out
    created = json.JSONDecoder().raw_decode(out[out.index("{\n") :])[0]
    assert created["clientUid"] == 1000
    assert main(xpuctl(daemon, "get", created["id"])) == 0
    assert "  client uid 1000" in capsys.readouterr().out
    assert main(xpuctl(daemon, "create", "--gpu", "4", "--compute", "10", "--uid", "0")) == 1
    err = capsys.readouterr().err
    assert "FAILED_PRECONDITION" in err and "uid 0" in err and "uid 1000" in err
    with pytest.raises(SystemExit):  # (uid_t)-1 is refused before anything is sent
        main(xpuctl(daemon, "create", "--gpu", "4", "--uid", "4294967295"))
    assert main(xpuctl(daemon, "delete", created["id"])) == 0
