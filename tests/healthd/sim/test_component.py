"""The simulated node follows the simulated processes whatever the metrics settings say: the daemon, started on a
simulated card with process and pod metrics off, still writes ``<proc_root>/<pid>`` for a process injected into it,
and removes it when the process exits (partition owner checks and the probes read that tree too)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.daemon.config import parse_config
from healthd.daemon.daemon import Daemon


async def _until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    give_up = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < give_up, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("metrics", [False, True], ids=["attribution-metrics-off", "attribution-metrics-on"])
def test_injected_process_appears_in_the_simulated_proc_tree(tmp_path: Path, metrics: bool) -> None:
    config = parse_config(
        {
            "daemon": {
                "simulate": "h200x1",
                "state_dir": str(tmp_path / "state"),
                "metrics_listen": "127.0.0.1:0",
                "grpc_listen": [f"unix:{tmp_path}/healthd.sock"],
            },
            "sampler": {"interval_seconds": 0.2},
            "attribution": {"process_metrics": metrics, "pod_metrics": metrics},
            "topology": {"enabled": False},
        }
    )
    proc = tmp_path / "state" / "sim-node" / "proc" / "4242"

    def listed(present: bool) -> bool:
        snapshot = daemon.latest()
        pids = {p.pid for g in snapshot.gpus for p in g.processes} if snapshot is not None else set()
        return (4242 in pids) == present

    async def scenario() -> None:
        await daemon.start()
        try:
            backend = daemon.backend
            assert isinstance(backend, SimulatedBackend)
            backend.inject("process_start", 0, {"pid": "4242", "name": "trainer"})
            await _until(lambda: listed(True))
            await asyncio.sleep(0.5)  # a few more cycles: whatever follows the Snapshots has had its turn
            assert (proc / "comm").read_text() == "trainer\n"
            assert (proc / "cgroup").is_file() and (proc / "stat").is_file()
            backend.inject("process_exit", 0, {"pid": "4242"})
            await _until(lambda: listed(False))
            await asyncio.sleep(0.5)
            assert not proc.exists()
        finally:
            await daemon.stop()

    daemon = Daemon(config, allow_fallback=False)
    asyncio.run(scenario())
