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
