"""kill -9 in the middle of creates and deletes: every answered change is on disk and a restart matches again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import SPEC_FILE, CdiWriter
from healthd.partition.manager import PartitionManager
from healthd.partition.model import State
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.sharing import SharingPolicy, shared_daemon_id
from healthd.partition.store import Store
from tests.support.paths import REPO


@pytest.mark.parametrize("sharing", list(SharingPolicy))
def test_sigkill_loses_nothing_committed_and_restart_matches(tmp_path: Path, sharing: SharingPolicy) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.healthd.partition.crash_worker", str(tmp_path), sharing.value],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    created: set[str] = set()
    deleted: set[str] = set()
    lines = 0
    deadline = time.monotonic() + 60
    while lines < 150 and time.monotonic() < deadline:
        verb, _, pid = proc.stdout.readline().strip().partition(" ")
        (created if verb == "created" else deleted).add(pid)
        lines += 1
    os.kill(proc.pid, signal.SIGKILL)  # mid-flight: the worker keeps changing state until the signal lands
    proc.wait()
    proc.stdout.close()
    assert lines == 150

    db = sqlite3.connect(tmp_path / "state.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    store = Store(tmp_path / "state.sqlite")
    rows = {r.id: r for r in store.all()}
    # every change the worker reported was committed before it printed
    assert (created - deleted) <= set(rows)
    assert not (deleted & set(rows))
    assert sum(r.compute_percent for r in rows.values()) <= 100
    store.close()

    async def restart() -> PartitionManager:
        backend = SimulatedBackend.from_name("h200x8")
        backend.open()
        mps = SimulatedMpsControl()
        m = PartitionManager(
            backend,
            Store(tmp_path / "state.sqlite"),
            MpsSupervisor(mps, tmp_path / "run"),
            CdiWriter(tmp_path / "cdi"),
            OwnerProbe(clock=lambda: 0.0),
            clock=lambda: 0.0,
            default_sharing=sharing,
        )
        await m.start()
        ready = {p.id for p in m.list_partitions()}
        assert all(p.state is State.READY for p in m.list_partitions())
        # the control daemons the policy asks for, again: one per partition, or one for the card
        wanted = (
            ready if sharing is SharingPolicy.ISOLATED else {shared_daemon_id(p.gpu_uuid) for p in m.list_partitions()}
        )
        assert mps.running() == wanted
        spec = json.loads((tmp_path / "cdi" / SPEC_FILE).read_text())
        assert {d["name"] for d in spec["devices"]} == ready
        assert {p.id for p in m.list_partitions()} >= (created - deleted)
        await m.close()
        return m

    asyncio.run(restart())
