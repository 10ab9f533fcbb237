"""Shared builders: a partition manager on the simulated node with a real SQLite store, CDI dir and fake clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import CdiWriter
from healthd.partition.manager import ManagerSettings, PartitionManager
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe, PodExists
from healthd.partition.service import PartitionsService
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store
from healthd.partition.wiring import SERVICE_NAME, add_partitions
from healthd.rpc.server import GrpcServer, Service


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
        settings: ManagerSettings | None = None,
        proc_root: Path = Path("/proc"),
        new_id: Callable[[], str] | None = None,
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
            default_sharing=self.sharing,
            **({"new_id": new_id} if new_id else {}),
        )


@pytest.fixture(params=list(SharingPolicy), ids=lambda p: f"tdm-{p}")
def sharing(request: pytest.FixtureRequest) -> SharingPolicy:
    """Every test that builds a node runs under both TDM sharing policies."""
    return SharingPolicy(request.param)


@pytest.fixture
def make_node(tmp_path: Path, sharing: SharingPolicy) -> Callable[[str], Node]:
    def make(scenario: str = "h200x8") -> Node:
        backend = SimulatedBackend.from_name(scenario)
        backend.open()
        return Node(root=tmp_path, backend=backend, clock=FakeClock(), sharing=sharing)

    return make


@dataclass
class Daemon:
    """A partition service on a real grpc.aio server (own event loop thread): admin and read-only sockets."""

    admin: str
    read: str
    manager: PartitionManager
    loop: asyncio.AbstractEventLoop


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = Path(tmp_path_factory.mktemp("svc"))
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    manager = PartitionManager(
        backend,
        Store(root / "state.sqlite"),
        MpsSupervisor(SimulatedMpsControl(), root / "run"),
        CdiWriter(root / "cdi"),
        OwnerProbe(cgroup_root=root / "cg", clock=lambda: 0.0),
        settings=ManagerSettings(owner_grace_seconds=3600),
        clock=lambda: 0.0,
    )
    admin = GrpcServer(
        [f"unix:{root}/a.sock"],
        [Service(SERVICE_NAME, PartitionsService(manager, writable=True), add_partitions)],
        socket_mode=0o600,
    )
    read = GrpcServer(
        [f"unix:{root}/r.sock"], [Service(SERVICE_NAME, PartitionsService(manager, writable=False), add_partitions)]
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> None:
        await manager.start()
        await admin.start()
        await read.start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield Daemon(f"unix:{root}/a.sock", f"unix:{root}/r.sock", manager, loop)

    async def stop() -> None:
        await admin.stop(0)
        await read.stop(0)

    asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
