"""The real MPS control path against a stand-in binary: the daemon is started with -d and private directories,
the partition's quota goes in as control-daemon defaults on stdin, and a failed command never leaves a daemon
running without its quota. (Enforcement itself needs a real GPU; see docs/partitioning.md.)"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from healthd.partition.mps import MpsError, MpsSupervisor, NvidiaMpsControl

FAKE = """#!{python}
import json, os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
control = os.path.join(pipe, "control")
record = {{"argv": sys.argv[1:], "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "pipe": pipe, "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}
if sys.argv[1:] == ["-d"]:
    open(control, "w").close()
else:
    text = sys.stdin.read().strip()
    record["stdin"] = text
    if not os.path.exists(control):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    if text.split()[0] == os.environ.get("FAKE_MPS_FAIL"):
        print("invalid command", file=sys.stderr)
        sys.exit(1)
    if text == "quit":
        os.remove(control)
with open(os.environ["FAKE_MPS_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(FAKE.format(python=sys.executable))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    return binary, log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_start_sets_quota_defaults_then_quit(tmp_path: Path, fake_binary: tuple[Path, Path]) -> None:
    binary, log = fake_binary
    sup = MpsSupervisor(NvidiaMpsControl(str(binary)), tmp_path / "run")
    spec = sup.spec_for("p-1", "GPU-abc", 30, 2048)
    sup.ensure(spec)
    got = calls(log)
    assert [c["argv"] for c in got] == [["-d"], [], []]
    assert [c.get("stdin") for c in got[1:]] == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 2G",
    ]
    assert {c["visible"] for c in got} == {"GPU-abc"}
    assert {c["pipe"] for c in got} == {str(tmp_path / "run" / "mps" / "p-1" / "pipe")}
    for directory in (spec.pipe_dir.parent.parent, spec.pipe_dir.parent, spec.pipe_dir, spec.log_dir):
        assert os.stat(directory).st_mode & 0o777 == 0o755, directory  # every uid's MPS server gets through
    assert sup.control.alive(spec)
    sup.ensure(spec)  # already running: not started twice
    assert [c["argv"] for c in calls(log)].count(["-d"]) == 1
    sup.release(spec)
    assert [c.get("stdin") for c in calls(log)].count("quit") == 1
    assert not (tmp_path / "run" / "mps" / "p-1").exists()


def test_directories_are_0755_under_a_restrictive_umask(tmp_path: Path, fake_binary: tuple[Path, Path]) -> None:
    """Under the packaged unit (UMask=0027) mkdir alone would give 0750: an MPS server running as the client's uid
    could not reach <pipe>/control. Directories an older version left 0750/0700 are opened up too; none becomes
    writable by others."""
    binary, _ = fake_binary
    stale = tmp_path / "run" / "mps" / "p-9" / "log"
    stale.mkdir(parents=True)
    for path in (stale, stale.parent, stale.parent.parent):
        path.chmod(0o700)
    old = os.umask(0o027)
    try:
        sup = MpsSupervisor(NvidiaMpsControl(str(binary)), tmp_path / "run")
        for pid in ("p-8", "p-9"):
            spec = sup.spec_for(pid, "GPU-abc", 30, 0)
            sup.ensure(spec)
            dirs = (spec.pipe_dir.parent.parent, spec.pipe_dir.parent, spec.pipe_dir, spec.log_dir)
            assert {oct(os.stat(d).st_mode & 0o777) for d in dirs} == {"0o755"}, pid
    finally:
        os.umask(old)


def test_unlimited_partition_sends_no_defaults(tmp_path: Path, fake_binary: tuple[Path, Path]) -> None:
    binary, log = fake_binary
    sup = MpsSupervisor(NvidiaMpsControl(str(binary)), tmp_path / "run")
    sup.ensure(sup.spec_for("p-2", "GPU-abc", 0, 0))
    assert [c["argv"] for c in calls(log)] == [["-d"]]  # started, no defaults sent


def test_failed_default_stops_the_daemon(
    tmp_path: Path, fake_binary: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, log = fake_binary
    monkeypatch.setenv("FAKE_MPS_FAIL", "set_default_device_pinned_mem_limit")
    control = NvidiaMpsControl(str(binary))
    spec = MpsSupervisor(control, tmp_path / "run").spec_for("p-3", "GPU-abc", 30, 2048)
    with pytest.raises(MpsError, match="invalid command"):
        control.start(spec)
    assert calls(log)[-1].get("stdin") == "quit"
    assert not control.alive(spec)


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    control = NvidiaMpsControl(str(tmp_path / "absent"))
    sup = MpsSupervisor(control, tmp_path / "run")
    spec = sup.spec_for("p-4", "GPU-abc", 30, 0)
    with pytest.raises(MpsError, match="absent"):
        sup.ensure(spec)
    assert not (tmp_path / "run" / "mps" / "p-4").exists()  # nothing left behind
    assert sup.known() == set()


def test_memory_text_forms() -> None:
    from healthd.partition.mps_spec import mps_memory

    assert mps_memory(2048) == "2G"
    assert mps_memory(640) == "640M"
    assert mps_memory(1152) == "1152M"
