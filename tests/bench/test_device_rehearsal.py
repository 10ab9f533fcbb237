"""The device check rehearsed end to end on the device machine's package set, on the simulated node.

A virtualenv holds exactly the GPU machine's own packages that the check touches (bench/device_image.txt, pip
--no-deps) and nothing of this project's dev set; bench/device_wheels.sh downloads the wheels that are carried
there. Then ``bench/device_check.sh --rehearse`` runs every step with its real limits, one step forced over its
limit (XPU_CHECK_LIMITS) and one forced to fail (XPU_CHECK_FAIL), and a second run is stopped with SIGTERM. What
is checked is what the real run must guarantee: the daemon and the check import there; every step starts and
reports; $OUT holds at most 8 files, at most 2 folders down, with names the device tool accepts; a summary exists
after a failure, a kill and a SIGTERM; the run stays inside its budget by its own accounting; the output's last
lines are the summary.

The machine runs CPython 3.12; the virtualenv uses a python3.12 found here (on PATH or under pyenv) and falls
back to this interpreter (3.11 on Debian 12), which the daemon and the check both support. It is built once and
cached in ``.cache/device-venv/`` (or ``$XPU_DEVICE_VENV_CACHE``), keyed by the interpreter, the package list and
the wheel script. What it does not prove: anything about a GPU, a driver, or torch (not installed here).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import check_pack, check_plan
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CACHE = Path(os.environ.get("XPU_DEVICE_VENV_CACHE") or REPO / ".cache" / "device-venv")
RECIPE = 1  # bump to rebuild cached virtualenvs after changing how they are made
IMAGE = REPO / "bench" / "device_image.txt"
WHEELS = REPO / "bench" / "device_wheels.sh"
FORCED = {"throughput": "killed", "xid": "failed"}
MISSING_ON_THE_MACHINE = {"structlog", "grpcio-health-checking", "grpcio-reflection", "grpcio-status",
                          "googleapis-common-protos", "nvitop", "nvitop-exporter"}  # fmt: skip


@dataclass(frozen=True)
class DeviceEnv:
    python: Path
    wheels: Path

    def env(self, **extra: str) -> dict[str, str]:
        """Nothing of this checkout's virtualenv or PYTHONPATH: only the device set on PATH."""
        keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return {**keep, "PATH": f"{self.python.parent}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def device_python() -> str:
    """A CPython 3.12 if this machine has one that runs, else this interpreter."""
    candidates = [
        shutil.which("python3.12"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))),
    ]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sys, venv; print(sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        if done.returncode == 0 and done.stdout.strip() == "(3, 12)":
            return candidate
    return sys.executable


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(map(str, argv))}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def device() -> DeviceEnv:
    python = device_python()
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             timeout=30, check=True).stdout  # fmt: skip
    key = hashlib.sha256(repr((RECIPE, version, IMAGE.read_text(), WHEELS.read_text())).encode()).hexdigest()[:12]
    root = CACHE / key
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "ready").exists():
            shutil.rmtree(root, ignore_errors=True)
            run([python, "-m", "venv", str(root / "venv")])
            pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            run([*pip, "--no-deps", "-r", str(IMAGE)])
            run(["bash", str(WHEELS)], env={**os.environ, "XPU_WHEELS_DIR": str(root / "wheels")}, cwd=REPO)
            for old in CACHE.iterdir():  # virtualenvs of an older recipe, list or interpreter
                if old.is_dir() and old != root:
                    shutil.rmtree(old, ignore_errors=True)
            (root / "ready").write_text(version)
    return DeviceEnv(root / "venv" / "bin" / "python", root / "wheels")


def test_the_daemon_and_the_check_import_on_the_device_set_plus_the_carried_wheels(
    device: DeviceEnv, tmp_path: Path
) -> None:
    bare = subprocess.run([str(device.python), "-c", "import healthd.main"], cwd=REPO, env=device.env(),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert bare.returncode != 0 and "structlog" in bare.stderr, "the venv must lack what the machine lacks"
    for optional in ("bcrypt", "systemd"):
        absent = subprocess.run([str(device.python), "-c", f"import {optional}"], env=device.env(),
                                capture_output=True, timeout=60, check=False)  # fmt: skip
        assert absent.returncode != 0, f"{optional} is not on the device machine"
    site = tmp_path / "site"
    run([str(device.python), "bench/check_setup.py", "--out", str(tmp_path), "--wheels", str(device.wheels),
         "--site", str(site)], cwd=REPO, env=device.env())  # fmt: skip
    wheels = json.loads((tmp_path / "result.json").read_text())["wheels"]
    assert {entry.split()[0] for entry in wheels["installed"]} == MISSING_ON_THE_MACHINE
    assert {entry.split()[0] for entry in wheels["kept"]} == {"grpcio", "protobuf", "nvidia-ml-py", "prometheus-client"}
    env = device.env(PYTHONPATH=f"{site}{os.pathsep}{REPO}")
    run([str(device.python), "-W", "error", "-c", "import healthd.main, bench.device_check"], cwd=REPO, env=env)


def summary(out: Path) -> dict[str, object]:
    return dict(json.loads((out / check_pack.SUMMARY_JSON).read_text()))


def check_out(out: Path) -> None:
    assert check_pack.problems(out) == []
    assert sorted(p.name for p in out.iterdir()) == sorted(check_pack.OUR_FILES)


def test_the_rehearsal_runs_every_step_and_reports_a_failure_and_a_kill(device: DeviceEnv, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = device.env(OUT=str(out), XPU_CHECK_LIMITS="throughput=2", XPU_CHECK_FAIL="xid")
    done = subprocess.run(["bash", "bench/device_check.sh", "--rehearse", "--wheels", str(device.wheels)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]  # a step failed, on purpose
    check_out(out)
    state = summary(out)
    steps = {s["name"]: s for s in state["steps"]}  # type: ignore[attr-defined]
    assert list(steps) == [s.name for s in check_plan.STEPS], "every step is in the summary"
    for name, step in steps.items():
        assert step["status"] == FORCED.get(name, "ok"), f"{name}: {step['status']} {step['reason']} {step['tail']}"
        assert step["over_limit"] is (name == "throughput"), f"{name} ran {step['elapsed_s']} s of {step['limit_s']}"
    assert steps["throughput"]["reason"] == "killed at its limit of 2 s"
    assert "fails on purpose" in "\n".join(steps["xid"]["tail"])
    assert state["finished"] is True and state["interrupted"] is None
    assert state["budget_s"] == check_plan.FULL_BUDGET_S
    assert state["elapsed_s"] <= state["budget_s"]  # type: ignore[operator]
    assert state["limits_total_s"] + check_plan.RESERVE_S <= state["budget_s"]  # type: ignore[operator]
    # the steps ran their real code: the figures say so
    assert steps["setup"]["figures"]["wheels"]["error"] is None
    assert "passed" in steps["contract"]["line"] and "failed" not in steps["contract"]["line"]
    assert steps["daemon"]["figures"]["ok"] is True and steps["daemon"]["figures"]["seconds"] == 60
    assert all(p["env_ok"] for p in steps["tdm"]["figures"]["policies"])
    assert steps["gpm"]["figures"]["0"]["gpm_supported"] is True  # the capture's card, through NvmlBackend
    assert steps["peers"]["figures"]["xpu-healthd"]["samples"] >= 1
    # the output's last lines restate the summary
    text = (out / check_pack.SUMMARY_TXT).read_text().strip()
    assert done.stdout.rstrip().endswith(text)
    assert " 5 xid        failed" in text and " 9 throughput killed" in text
    with tarfile.open(out / check_pack.TARBALL) as tar:
        logs = {Path(name).parts[1] for name in tar.getnames() if name.endswith("/log.txt")}
    assert logs == set(steps)


def test_sigterm_stops_the_running_step_and_leaves_the_summary(device: DeviceEnv, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", "bench/device_check.sh", "--rehearse", "--only", "daemon", "--wheels",
                             str(device.wheels)], cwd=REPO, env=device.env(OUT=str(out)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not daemon_running(out):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon step never started"
            time.sleep(0.2)
        time.sleep(3)  # the daemon is up, its minute has begun
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, stdout[-3000:]
    check_out(out)
    state = summary(out)
    assert state["interrupted"] == "SIGTERM received" and state["finished"] is False
    daemon = next(s for s in state["steps"] if s["name"] == "daemon")  # type: ignore[attr-defined]
    assert (daemon["status"], daemon["reason"]) == ("killed", "SIGTERM received")
    assert stdout.rstrip().endswith((out / check_pack.SUMMARY_TXT).read_text().strip())
    assert leftovers(proc.pid, str(state["work_dir"])) == [], "a process of the check outlived it"


def daemon_running(out: Path) -> bool:
    try:
        steps = summary(out)["steps"]
    except (OSError, ValueError):
        return False
    return any(s["name"] == "daemon" and s["status"] == "running" for s in steps)  # type: ignore[attr-defined]


def leftovers(sid: int, work_dir: str) -> list[str]:
    """Live processes in the check's session, or of its steps (each ran in a session of its own): any whose
    command line names the check's work folder, as the step's daemon's does (--state-dir)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) == sid or work_dir in cmdline):
            found.append(cmdline)
    return found
