"""What survives a daemon crash (Node) and a partition service on a real gRPC server (Daemon), for partition tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import CdiWriter
from healthd.partition.manager import PartitionManager
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe, PodExists
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store
from tests.support.clock import FakeClock


@dataclass
class Node:
    """Everything that survives a daemon crash: the (simulated) GPUs, the state dir, the CDI dir, the clock."""

    root: Path
    backend: SimulatedBackend
    clock: FakeClock
    sharing: SharingPolicy = SharingPolicy.ISOLATED  # the default TDM sharing of its manager

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
        settings: PartitionSettings | None = None,
        destroy_retry_seconds: float = 0.0,
        proc_root: Path = Path("/proc"),
        new_id: Callable[[], str] | None = None,
    ) -> PartitionManager:
        return PartitionManager(
            self.backend,
            Store(self.state_file),
            MpsSupervisor(mps or SimulatedMpsControl(), self.root / "run"),
            CdiWriter(self.cdi_dir),
            OwnerProbe(proc_root=proc_root, cgroup_root=self.root / "cgroup", pod_exists=pod_exists, clock=self.clock),
            settings=settings or PartitionSettings(owner_grace_seconds=0.0),
            destroy_retry_seconds=destroy_retry_seconds,
            clock=self.clock,
            proc_root=proc_root,
            default_sharing=self.sharing,
            **({"new_id": new_id} if new_id else {}),
        )


@dataclass
class Daemon:
    """A partition service on a real grpc.aio server (own event loop thread): admin and read-only sockets."""

    admin: str
    read: str
    manager: PartitionManager
    loop: asyncio.AbstractEventLoop
