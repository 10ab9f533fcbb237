"""Shared builders: a partition manager on the simulated node with a real SQLite store, CDI dir and fake clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import CdiWriter
from healthd.partition.manager import ManagerSettings, PartitionManager
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe, PodExists
from healthd.partition.store import Store


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Node:
    """Everything that survives a daemon crash: the (simulated) GPUs, the state dir, the CDI dir, the clock."""

    root: Path
    backend: SimulatedBackend
    clock: FakeClock

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "partitions.sqlite"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def manager(
        self,
        *,
        mps: SimulatedMpsControl | None = None,
        pod_exists: PodExists | None = None,
        settings: ManagerSettings | None = None,
        proc_root: Path = Path("/proc"),
    ) -> PartitionManager:
        return PartitionManager(
            self.backend,
            Store(self.state_file),
            MpsSupervisor(mps or SimulatedMpsControl(), self.root / "run"),
            CdiWriter(self.cdi_dir),
            OwnerProbe(proc_root=proc_root, cgroup_root=self.root / "cgroup", pod_exists=pod_exists, clock=self.clock),
            settings=settings or ManagerSettings(owner_grace_seconds=0.0, destroy_retry_seconds=0.0),
            clock=self.clock,
            proc_root=proc_root,
        )


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[[str], Node]:
    def make(scenario: str = "h200x8") -> Node:
        backend = SimulatedBackend.from_name(scenario)
        backend.open()
        return Node(root=tmp_path, backend=backend, clock=FakeClock())

    return make
