"""Starting the MPS control daemon can never block on its output (mps_launch.py).

The stand-in binary (tests/fakes/nvidia-cuda-mps-control) daemonises like the real one and its daemon keeps the
stdout it inherited open for good. A start that captured that output waited for the pipe until its timeout; the
supervisor then removed the live daemon's directory. The transient-unit path is checked here against recording
stand-ins for systemd-run and systemctl; tests/packaging/test_deb_nspawn.py runs it under a real systemd.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.partition.mps import MpsError, MpsSupervisor, NvidiaMpsControl
from healthd.partition.mps_launch import (
    MPS_SLICE,
    DetachedLauncher,
    TransientUnitLauncher,
    launcher_from_env,
    mps_unit_name,
)
from healthd.partition.mps_spec import MpsDaemonSpec
from tests.support.paths import TESTS

FAKE = TESTS / "fakes" / "nvidia-cuda-mps-control"


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    yield log
    for pid in {int(str(c["pid"])) for c in calls(log) if "listening" in c}:  # no fake daemon outlives a test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def daemon_pid(log: Path) -> int:
    """The fake daemon's pid: the process that listens on the control socket."""
    return int(str(next(c["pid"] for c in calls(log) if "listening" in c)))


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_stand_in_reproduces_the_hazard(tmp_path: Path, fake_log: Path) -> None:
    """Captured output of -d never reaches EOF: the daemon holds the pipe. (This is what made the old start fail.)"""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([str(FAKE), "-d"], env=env, capture_output=True, timeout=3, check=False)
    assert (pipe / "control").exists()  # the daemon came up all the same


def test_start_returns_while_the_daemon_keeps_its_stdout(tmp_path: Path, fake_log: Path) -> None:
    control = NvidiaMpsControl(str(FAKE), timeout_s=30, launcher=DetachedLauncher())
    sup = MpsSupervisor(control, tmp_path / "run")
    spec = sup.spec_for("p-1", "GPU-abc", 30, 2048)
    sup.ensure(spec)  # the old start raised MpsError here (timed out) and removed the directory
    assert control.alive(spec)
    pid = daemon_pid(fake_log)
    assert os.readlink(f"/proc/{pid}/fd/1") == "/dev/null"  # not a pipe to us
    assert os.getsid(pid) != os.getsid(0)  # its own session: our signals and terminal do not reach it
    got = calls(fake_log)
    assert next(c["argv"] for c in got if "argv" in c) == ["-d"]
    assert [c["daemon_command"] for c in got if "daemon_command" in c][:2] == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 2G",
    ]
    sup.release(spec)
    assert wait_gone(pid)
    assert not spec.pipe_dir.parent.exists()


def test_a_failed_start_reports_the_binarys_message(
    tmp_path: Path, fake_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_D_FAIL", "An instance of this daemon is already running")
    control = NvidiaMpsControl(str(FAKE), timeout_s=30, launcher=DetachedLauncher())
    sup = MpsSupervisor(control, tmp_path / "run")
    spec = sup.spec_for("p-2", "GPU-abc", 30, 0)
    with pytest.raises(MpsError, match=r"-d failed \(1\): An instance of this daemon is already running"):
        sup.ensure(spec)
    assert sup.known() == set()


def test_a_parent_that_never_returns_is_killed_at_the_deadline(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/parent.pid\nexec sleep 600\n")  # -d that never exits
    binary.chmod(0o755)
    control = NvidiaMpsControl(str(binary), timeout_s=3, launcher=DetachedLauncher())
    spec = MpsSupervisor(control, tmp_path / "run").spec_for("p-3", "GPU-abc", 0, 0)
    with pytest.raises(MpsError, match=r"-d did not return within 3s"):
        control.start(spec)
    assert wait_gone(int((tmp_path / "parent.pid").read_text()))


# ---- the transient-unit launcher, against recording stand-ins for systemd-run and systemctl -------------------

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:]}}) + "\\n")
if os.path.basename(sys.argv[0]) == "systemd-run" and os.environ.get("SYSTEMD_RUN_FAIL"):
    print(os.environ["SYSTEMD_RUN_FAIL"], file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def systemd_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TransientUnitLauncher, Path]:
    record = tmp_path / "systemd.jsonl"
    monkeypatch.setenv("RECORD", str(record))
    for tool in ("systemd-run", "systemctl"):
        path = tmp_path / tool
        path.write_text(RECORDER.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return TransientUnitLauncher(str(tmp_path / "systemd-run"), str(tmp_path / "systemctl")), record


def spec_in(tmp_path: Path) -> MpsDaemonSpec:
    spec = MpsSupervisor(NvidiaMpsControl(launcher=DetachedLauncher()), tmp_path / "run").spec_for("p-4", "GPU-x", 5, 0)
    spec.log_dir.mkdir(parents=True)
    return spec


def test_transient_unit_command_line(tmp_path: Path, systemd_tools: tuple[TransientUnitLauncher, Path]) -> None:
    launcher, record = systemd_tools
    spec = spec_in(tmp_path)
    launcher.launch(str(FAKE), spec, {"PATH": os.defpath}, 10.0)
    stop, run = [json.loads(line) for line in record.read_text().splitlines()]
    assert stop == {"tool": "systemctl", "argv": ["stop", "xpu-mps-p-4.service"]}  # a stale unit goes first
    argv = run["argv"]
    assert run["tool"] == "systemd-run"
    assert argv[-3:] == ["--", str(FAKE), "-d"]  # absolute path, as systemd needs
    options = set(argv[:-3])
    assert {
        "--quiet",
        "--collect",
        "--unit=xpu-mps-p-4.service",
        f"--slice={MPS_SLICE}",
        "--service-type=forking",
        "--property=TimeoutStartSec=10s",
        "--setenv=CUDA_VISIBLE_DEVICES=GPU-x",
        f"--setenv=CUDA_MPS_PIPE_DIRECTORY={spec.pipe_dir}",
        f"--setenv=CUDA_MPS_LOG_DIRECTORY={spec.log_dir}",
    } <= options


def test_transient_unit_failure_carries_systemds_message(
    tmp_path: Path, systemd_tools: tuple[TransientUnitLauncher, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher, _ = systemd_tools
    monkeypatch.setenv("SYSTEMD_RUN_FAIL", "Failed to start transient service unit: Access denied")
    control = NvidiaMpsControl(str(FAKE), launcher=launcher)
    spec = MpsSupervisor(control, tmp_path / "run").spec_for("p-5", "GPU-x", 0, 0)
    with pytest.raises(MpsError, match=r"systemd-run xpu-mps-p-5\.service failed \(1\): .*Access denied"):
        control.start(spec)


def test_transient_unit_needs_the_binary(tmp_path: Path, systemd_tools: tuple[TransientUnitLauncher, Path]) -> None:
    launcher, record = systemd_tools
    with pytest.raises(Exception, match="nvidia-cuda-mps-control: not found"):
        launcher.launch("nvidia-cuda-mps-control", spec_in(tmp_path), {"PATH": str(tmp_path / "empty")}, 10.0)
    assert not record.exists()  # nothing was started


def test_unit_names() -> None:
    assert mps_unit_name("p-1a2b3c4d5e6f") == "xpu-mps-p-1a2b3c4d5e6f.service"
    assert mps_unit_name("a b/c") == "xpu-mps-a\\x20b\\x2fc.service"


def test_launcher_from_env() -> None:
    assert launcher_from_env({}).name == "direct"
    assert launcher_from_env({"XPU_MPS_LAUNCH": ""}).name == "direct"
    assert launcher_from_env({"XPU_MPS_LAUNCH": "systemd-run"}).name == "systemd-run"
    with pytest.raises(ValueError, match="XPU_MPS_LAUNCH: must be direct or systemd-run, got 'systemd'"):
        launcher_from_env({"XPU_MPS_LAUNCH": "systemd"})


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start (setuid)")
def test_a_client_of_another_uid_reaches_its_server_under_the_units_umask(fake_log: Path) -> None:
    """The packaged unit's UMask=0027 made mps/ and mps/<id>/ 0750: the MPS server the control daemon starts as the
    client's uid could not reach <pipe>/control. Here the daemon's directories are made under that umask, a uid-1000
    client asks the stand-in daemon for a server, and that server (forked as uid 1000, opening <pipe>/log and
    connecting to <pipe>/control like the real one) comes up. tests/packaging/test_deb_nspawn.py does the same under
    the installed unit."""
    run = Path(tempfile.mkdtemp(prefix="xpu-mps-", dir="/tmp"))
    run.chmod(0o755)  # as systemd's RuntimeDirectoryMode=0755 makes /run/xpu-runtime-kit
    old = os.umask(0o027)
    try:
        control = NvidiaMpsControl(str(FAKE), timeout_s=30, launcher=DetachedLauncher())
        sup = MpsSupervisor(control, run)
        spec = sup.spec_for("p-uid", "GPU-abc", 30, 0)
        sup.ensure(spec)
        client = subprocess.run(
            ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", str(FAKE), "--cuda-client"],
            env={**{k: v for k, v in os.environ.items() if k != "FAKE_MPS_LOG"}, **spec.env()},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert client.returncode == 0, client.stdout + client.stderr
        assert client.stdout.strip() == "server ready: uid 1000"
        control_log = (spec.log_dir / "control.log").read_text()
        assert "NEW CLIENT from user 1000" in control_log and "Starting new server" in control_log
        assert "Startup as uid 1000" in (spec.log_dir / "server.log").read_text()
        sup.release(spec)
        assert not spec.pipe_dir.parent.exists()
    finally:
        os.umask(old)
        shutil.rmtree(run, ignore_errors=True)
