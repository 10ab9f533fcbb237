"""The TDM sharing experiment (bench/tdm_sharing.py), dry run on the simulated node: the same path through the
daemon's API (mode with a sharing policy, create, exec, delete) as on a real card, and the table it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.e2e


def test_dry_run_goes_through_the_daemon_for_both_policies_and_prints_the_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/tdm_sharing.py", "--simulate", "--seconds", "0.1", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:3] == ["policy", "A", "alone"]
    assert [line.split()[0] for line in lines[2:4]] == ["isolated", "shared"]
    assert "card settings changed: none" in done.stdout
    result = json.loads((tmp_path / "tdm_sharing.json").read_text())
    assert [p["policy"] for p in result["policies"]] == ["isolated", "shared"]
    for policy in result["policies"]:
        assert policy["env_ok"], policy["notes"]  # every client got its partition's pipe directory and quota
    uid = result["policies"][0]["uid1000"]
    assert uid.get("uid") == 1000 or "skipped" in uid, uid
    if "skipped" not in uid:
        # the client went through the daemon's own MPS directories (made under the unit's umask), not a folder the
        # bench made for it; whether that uid can reach the pipe is recorded, with the modes it met
        assert uid["pipe"]["dir"].startswith(result["runtime_dir"] + "/mps/")
        assert isinstance(uid["pipe"]["reachable"], bool)
        assert uid["dir_modes"]["run"].startswith("0755")
        assert any(key.startswith("run/mps/") and key.endswith("/pipe") for key in uid["dir_modes"])
        assert "pipe dir reachable:" in done.stdout
    assert (tmp_path / "tdm-daemon.log").stat().st_size > 0


def test_quick_keeps_the_runs_together_the_cap_and_the_uid1000_client(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/tdm_sharing.py", "--simulate", "--quick", "--seconds", "0.1", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "tdm_sharing.json").read_text())
    assert result["quick"] is True
    for policy in result["policies"]:
        assert policy["alone"] == {} and set(policy["together"]) == {"A", "B"}
        assert policy["env_ok"], policy["notes"]
    assert result["policies"][0]["uid1000"], "the uid-1000 client runs in the quick check too"
