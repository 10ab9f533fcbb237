"""A slow disk under the fault journal stalls neither sampling nor GetNodeHealth, and nothing unjournaled shows.

The journal here blocks its commits until released (a disk that takes as long as the test wants, not 200 ms):
while a probe's commit waits, the sampler keeps publishing and GetNodeHealth keeps answering over a real socket,
from the state as of the last commit. bench/slow_journal_bench.py measures the same with a 200 ms commit delay.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from healthd.faults.fault import FaultRecord
from healthd.faults.journal import Change, Journal
from healthd.probes import HealthSettings, ProbeHost, default_probes
from healthd.probes.runner import ProbeRunner
from tests.support.faults_helpers import DaemonThread
from tests.support.waiting import eventually


class GatedJournal(Journal):
    """Commits wait at the gate while it is closed, like writes to a disk that has stopped answering."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0

    def commit(self, changes: Sequence[Change], at: float, **kwargs: Any) -> list[FaultRecord]:
        if not self.gate.is_set():
            self.waiting += 1
            self.gate.wait(60)
        return super().commit(changes, at, **kwargs)


def test_a_blocked_journal_stalls_neither_sampling_nor_node_health(tmp_path: Path) -> None:
    journal = GatedJournal(tmp_path / "faults.sqlite")
    backend = SimulatedBackend.from_name("h200x8")
    with DaemonThread(tmp_path, tmp_path / "h.sock", journal=journal) as daemon:
        sampler = Sampler(backend, SamplerSettings(interval_seconds=60, call_deadline_seconds=5))
        runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), daemon.engine)
        sampler.subscribe(runner.on_snapshot, "probes")
        try:
            sampler.run_once()
            assert sampler.wait_subscribers()
            journal.gate.clear()  # the disk stops answering
            backend.inject("remap_failure", 1)
            sampler.run_once()
            sampler.run_once()  # the second evaluation opens the fault: its commit now waits at the gate
            assert eventually(lambda: journal.waiting >= 1, 20.0)
            seqs = [sampler.run_once().seq for _ in range(5)]
            assert seqs == list(range(seqs[0], seqs[0] + 5)), "sampling goes on while the probes wait"
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb_grpc.HealthStub(channel)
                health = stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=10)
                assert [f.code for f in health.active_faults] == [], "a fault not on disk yet is not shown"
                journal.gate.set()
                assert eventually(
                    lambda: (
                        [f.code for f in stub.GetNodeHealth(pb.GetNodeHealthRequest(), timeout=10).active_faults]
                        == ["ecc_row_remap_failure"]
                    ),
                    20.0,
                )
            stats = {s.name: s for s in sampler.subscriber_stats()}
            assert stats["probes"].skipped >= 1, "the probes skipped snapshots instead of holding up the sampler"
        finally:
            journal.gate.set()
            sampler.stop()
