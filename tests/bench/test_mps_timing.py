"""bench/mps_timing.py (a device-check section) against the stand-in control binary: it starts, queries and stops
a control daemon per run, prints the phases and leaves no daemon behind. The real numbers come from a GPU node."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench import mps_timing
from tests.support.paths import TESTS

FAKE = TESTS / "fakes" / "nvidia-cuda-mps-control"


def test_times_each_phase_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    rc = mps_timing.main(["--binary", str(FAKE), "--gpu-uuid", "GPU-x", "--runs", "2", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["start", "get_server_list", "quit"]
    runs = json.loads((tmp_path / "mps_timing.json").read_text())["runs"]
    assert len(runs) == 2
    assert all(r[phase] > 0 for r in runs for phase in mps_timing.PHASES)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    commands = [c["daemon_command"] for c in calls if "daemon_command" in c]
    assert commands.count("quit") == 2
    assert "set_default_active_thread_percentage 50" in commands
    for pid in {c["pid"] for c in calls if "listening" in c}:  # every daemon it started has quit
        assert gone(pid), f"control daemon {pid} still running"


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True  # exited, not yet reaped by its new parent
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_without_the_binary_it_measures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert mps_timing.main(["--binary", "/nonexistent/nvidia-cuda-mps-control"]) == 0
    assert "not installed; nothing measured" in capsys.readouterr().out
