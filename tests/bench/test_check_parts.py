"""The device check's parts: the plan and its budgets, a step killed at its limit with everything it started,
what $OUT may hold, the wheel choice on the device, and the summary of a run that was stopped."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import check_pack, check_plan, check_setup, device_report
from bench.check_runner import Outcome, run_step
from tests.support.paths import REPO


def test_the_step_limits_fit_each_budget_with_the_reserve() -> None:
    for quick in (False, True):
        total = sum(step.limit(quick) for step in check_plan.STEPS)
        assert total + check_plan.RESERVE_S <= check_plan.budget(quick)
    assert check_plan.budget(False) == 360 and check_plan.budget(True) == 180


def test_the_steps_run_in_order_of_value() -> None:
    names = [step.name for step in check_plan.STEPS]
    assert names == ["setup", "contract", "daemon", "gpm", "xid", "mps", "tdm", "overhead", "throughput", "peers"]


@pytest.mark.parametrize("rehearse", [False, True])
@pytest.mark.parametrize("quick", [False, True])
def test_every_step_command_names_files_that_exist(tmp_path: Path, rehearse: bool, quick: bool) -> None:
    ctx = check_plan.Context(rehearse, quick, tmp_path, tmp_path / "whl", tmp_path / "site")
    for step in check_plan.STEPS:
        argv = step.command(ctx)
        assert argv[0] == sys.executable
        for arg in argv[1:]:
            if arg.startswith(("bench/", "tests/")):
                assert (REPO / arg).exists(), f"{step.name}: {arg}"
        modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
        for module in modules:
            if module.startswith("bench."):
                assert (REPO / (module.replace(".", "/") + ".py")).exists(), f"{step.name}: {module}"
        assert ("--rehearse" in argv or "--simulate" in argv or "bench.with_capture_nvml" in argv) == (
            rehearse and step.name in ("daemon", "gpm", "xid", "tdm", "overhead", "throughput", "peers")
        ), f"{step.name}: {argv}"
    contract = next(s for s in check_plan.STEPS if s.name == "contract")
    assert contract.env(ctx) == ({} if rehearse else {"XPU_TEST_REAL_NVML": "1"})


def test_limit_overrides_and_forced_failures_are_checked() -> None:
    assert check_plan.limit_overrides("daemon=20, tdm=7.5") == {"daemon": 20.0, "tdm": 7.5}
    assert check_plan.limit_overrides("") == {}
    for bad in ("daemon", "nosuch=3", "daemon=soon", "daemon=0"):
        with pytest.raises(ValueError, match="XPU_CHECK_LIMITS"):
            check_plan.limit_overrides(bad)
    assert check_plan.forced_failures("xid,gpm") == {"xid", "gpm"}
    with pytest.raises(ValueError, match="no such step: nosuch"):
        check_plan.forced_failures("nosuch")


def run(tmp_path: Path, code: str, limit: float, stop: str | None = None) -> Outcome:
    return run_step(Outcome("s", "a step", limit), [sys.executable, "-c", code], cwd=tmp_path, env=os.environ,
                    log=tmp_path / "log.txt", limit_s=limit, stop_requested=lambda: stop)  # fmt: skip


def test_a_step_that_exits_is_ok_or_failed_with_its_tail(tmp_path: Path) -> None:
    ok = run(tmp_path, "print('fine')", 30)
    assert (ok.status, ok.rc, ok.over_limit) == ("ok", 0, False)
    failed = run(tmp_path, "import sys; print('x' * 500); sys.exit('it broke')", 30)
    assert (failed.status, failed.rc, failed.reason) == ("failed", 1, "exit status 1")
    assert failed.tail[-1] == "it broke" and len(failed.tail[-2]) <= 240


def test_a_step_over_its_limit_is_killed_with_everything_in_its_group(tmp_path: Path) -> None:
    """The step starts a child that ignores SIGTERM (as a daemon busy stopping may): the group still goes."""
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "open('child.pid', 'w').write(str(p.pid)); print('started', flush=True); time.sleep(120)\n"
    )
    outcome = run(tmp_path, code, 2.0)
    assert outcome.status == "killed" and outcome.reason == "killed at its limit of 2 s"
    assert outcome.over_limit and outcome.tail[-1] == "started"
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), "the step's child outlived the kill"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_stop_request_ends_the_running_step(tmp_path: Path) -> None:
    outcome = run(tmp_path, "import time; time.sleep(60)", 60, stop="SIGTERM received")
    assert (outcome.status, outcome.reason) == ("killed", "SIGTERM received")


def test_out_problems_name_what_the_device_tool_would_not_bring_back(tmp_path: Path) -> None:
    assert check_pack.problems(tmp_path) == []
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    found = check_pack.problems(tmp_path)
    assert "11 files (at most 8 come back)" in found
    assert any("deep.txt: more than 2 folders down" in p for p in found)
    assert any("bad name.txt: name outside" in p for p in found)


def test_pack_writes_four_files_and_a_tarball_of_regular_files_only(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "xdc-1"
    (work / "daemon" / "d").mkdir(parents=True)
    (work / "site").mkdir()
    (work / "daemon" / "log.txt").write_text("line\n" * 10)
    (work / "daemon" / "big.log").write_bytes(b"a" * 5000 + b"THE END")
    (work / "site" / "structlog.py").write_text("installed wheel, not evidence")
    os.mkfifo(work / "daemon" / "d" / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(work / "daemon" / "d" / "control"))
        out.mkdir()
        (out / check_pack.CONSOLE).write_text("printed\n")
        check_pack.pack(out, work, "summary", "{}", skip=frozenset({"site"}))
    assert sorted(p.name for p in out.iterdir()) == sorted(check_pack.OUR_FILES)
    assert check_pack.problems(out) == []
    with tarfile.open(out / check_pack.TARBALL) as tar:
        assert sorted(tar.getnames()) == ["xdc-1/daemon/big.log", "xdc-1/daemon/log.txt"]
    with tarfile.open(fileobj=io.BytesIO(check_pack.tarball(work, cap=100))) as small:  # each file's tail only
        member = small.extractfile("xdc-1/daemon/big.log")
        assert member is not None and member.read().endswith(b"THE END")
        assert small.getmember("xdc-1/daemon/big.log").size < 200


def test_wheels_are_installed_only_where_the_machine_lacks_them_or_has_older(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [
        "structlog-26.1.0-py3-none-any.whl",
        "grpcio-1.85.1-cp312-cp312-manylinux2014_x86_64.whl",
        "protobuf-7.35.1-cp310-abi3-manylinux2014_x86_64.whl",
        "nvidia_ml_py-12.570.86-py3-none-any.whl",
    ]
    machine = {"grpcio": "1.80.0", "protobuf": "7.36.2", "nvidia-ml-py": "13.580.82+local"}
    monkeypatch.setattr(check_setup, "installed", machine.get)
    install, why, kept = check_setup.select_wheels([tmp_path / n for n in names])
    assert [p.name.split("-")[0] for p in install] == ["grpcio", "structlog"]
    assert why == ["grpcio 1.85.1 (machine has 1.80.0)", "structlog 26.1.0 (missing)"]
    assert kept == ["nvidia-ml-py 13.580.82+local (carried 12.570.86)", "protobuf 7.36.2 (carried 7.35.1)"]
    assert check_setup.release("2.11.0+cu130") == (2, 11, 0) and check_setup.release("1.85.0rc1") == (1, 85, 0)


def test_device_wheels_carries_what_the_machine_lacks_and_no_optional_library() -> None:
    script = (REPO / "bench" / "device_wheels.sh").read_text()
    carried = {line.split("==")[0].strip() for line in script.splitlines() if "==" in line and "#" not in line[:3]}
    assert {"structlog", "grpcio-health-checking", "grpcio-reflection", "grpcio-status"} <= carried
    assert not carried & {"bcrypt", "systemd-python", "PyYAML", "pyyaml", "torch"}


def test_the_summary_of_a_stopped_run_says_what_ran_and_what_did_not() -> None:
    outcomes = [
        Outcome("setup", "", 15, "ok", 0, 1.0, figures={"wheels": {"installed": ["a"], "kept": []}, "gpus": "none"}),
        Outcome("contract", "", 35, "killed", -15, 3.2, "SIGTERM received", tail=["collecting ..."]),
        Outcome("daemon", "", 90, "not run", reason="not run: SIGTERM received"),
    ]
    state = {"rehearse": True, "quick": False, "started": "now", "budget_s": 360, "limits_total_s": 140,
             "elapsed_s": 4.2, "finished": False, "interrupted": "SIGTERM received", "settings": {},
             "files": list(check_pack.OUR_FILES)}  # fmt: skip
    text = device_report.summary_text(state, outcomes)
    assert "(not finished), stopped: SIGTERM received" in text
    assert " 2 contract   killed     3.2/35  s  SIGTERM received" in text
    assert "      | collecting ..." in text
    assert " 3 daemon     not run    0.0/90  s  not run: SIGTERM received" in text
    steps = json.loads(device_report.summary_json(state, outcomes))["steps"]
    assert [s["over_limit"] for s in steps] == [False, True, False]


def test_bench_never_changes_a_card_setting_or_resets_a_card() -> None:
    assert card_changes(REPO / "bench") == []


def card_changes(root: Path) -> list[str]:
    """Lines under ``root`` that would change MIG mode, clocks, power limit, compute or persistence mode, or
    reset a card: an NVML setter, or nvidia-smi with an option that changes a setting."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".sh") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if CARD_CHANGE.search(line) or ("nvidia-smi" in line and SMI_CHANGE.search(line)):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_the_card_change_scan_finds_each_kind(tmp_path: Path) -> None:
    bad = [
        "pynvml.nvmlDeviceSetMigMode(h, 1)",
        "pynvml.nvmlDeviceSetPowerManagementLimit(h, 300000)",
        "pynvml.nvmlDeviceResetGpuLockedClocks(h)",
        "subprocess.run(['nvidia-smi', '-mig', '1'])",
        "nvidia-smi -pm 1",
        'run(["nvidia-smi", "-i", "0", "-pl", "400"])',
        "nvidia-smi --gpu-reset -i 0",
        "nvidia-smi -c EXCLUSIVE_PROCESS",
        "nvidia-smi -lgc 1980",
        "nvidia-smi -r",
    ]
    for i, line in enumerate(bad):
        (tmp_path / f"b{i}.py").write_text(f"{line}\n")
    (tmp_path / "fine.sh").write_text("nvidia-smi --query-gpu=index,name --format=csv\npython3 -c 'print(1)'\n")
    assert len(card_changes(tmp_path)) == len(bad)


CARD_CHANGE = re.compile(r"nvml(Device(Set|Reset|Clear)\w+|GpuInstanceCreate\w*|DeviceCreateGpuInstance)")
SMI_CHANGE = re.compile(
    r"""(?:^|[\s'",\[])(-mig|-pm|-pl|-c|-r|-ac|-rac|-lgc|-rgc|-lmc|-rmc|-e|--gpu-reset|--persistence-mode|"""
    r"""--power-limit|--compute-mode|--applications-clocks|--lock-gpu-clocks|--lock-memory-clocks|--ecc-config)"""
    r"""(?=[\s'",=\]]|$)"""
)


def test_the_device_check_help_runs_with_the_standard_library_only() -> None:
    done = subprocess.run([sys.executable, "-S", "bench/device_check.py", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0 and "--rehearse" in done.stdout, done.stderr
