"""packaging/examples/: the replacement command the README runs under the reference hook, and its hook config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

SCRIPT = REPO / "packaging" / "examples" / "replace-node.sh"
CONFIG = REPO / "packaging" / "examples" / "hook.toml"


def run(spool: Path, fault_id: str, document: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XPU_HOOK_SPOOL": str(spool), "XPU_FAULT_ID": fault_id, "XPU_NODE_NAME": "node-a",
           "XPU_FAULT_ACTION": "replace_node", "XPU_FAULT_CODE": "xid_79", "XPU_FAULT_SEQ": "3"}  # fmt: skip
    return subprocess.run([str(SCRIPT)], input=document, env=env, capture_output=True, text=True, check=False)


def test_the_example_keeps_each_fault_once_and_says_so(tmp_path: Path) -> None:
    document = json.dumps({"idempotency_key": "flt-1", "node_name": "node-a", "fault": {"code": "xid_79"}})
    first = run(tmp_path / "spool", "flt-1", document)
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "spool" / "flt-1.json").read_text()) == json.loads(document)
    again = run(tmp_path / "spool", "flt-1", "{}")
    assert again.returncode == 0 and "already handled" in again.stdout
    assert json.loads((tmp_path / "spool" / "flt-1.json").read_text()) == json.loads(document)  # not overwritten


def test_a_failure_leaves_the_fault_to_be_delivered_again(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.write_text("a file where the directory should be")
    failed = run(spool, "flt-2", "{}")
    assert failed.returncode != 0  # the hook answers UNAVAILABLE and the daemon retries


def test_the_example_hook_config_is_accepted() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "healthd", "--check-config", "--simulate", "--config", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
