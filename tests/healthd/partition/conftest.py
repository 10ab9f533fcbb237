"""Shared builders: a partition manager on the simulated node with a real SQLite store, CDI dir and fake clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.daemon.config import Config, with_overrides
from healthd.partition.cdi import CdiWriter
from healthd.partition.component import SERVICE_NAME, add_partitions
from healthd.partition.manager import PartitionManager
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.service import PartitionsService
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store
from healthd.rpc.server import GrpcServer, Service
from tests.support.clock import FakeClock
from tests.support.partition_node import Daemon, Node


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


@pytest.fixture
def simulated_config(tmp_path: Path) -> Callable[[Config], Config]:
    """The whole daemon's config on the simulated 8x H200 node, all in tmp_path: the gRPC socket h.sock (the admin
    socket healthd-admin.sock beside it), state/, metrics on a free port; ``base`` sets the rest."""

    def make(base: Config) -> Config:
        return with_overrides(
            base,
            simulate="h200x8",
            metrics_listen="127.0.0.1:0",
            grpc_listen=(f"unix:{tmp_path}/h.sock",),
            state_dir=tmp_path / "state",
        )

    return make


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
        settings=PartitionSettings(owner_grace_seconds=3600),
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
