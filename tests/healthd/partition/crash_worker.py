"""Subprocess for the kill -9 test: creates and deletes TDM partitions in a loop, printing each committed change."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import CdiWriter
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store


async def main(root: Path, sharing: SharingPolicy) -> None:
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    manager = PartitionManager(
        backend,
        Store(root / "state.sqlite"),
        MpsSupervisor(SimulatedMpsControl(), root / "run"),
        CdiWriter(root / "cdi"),
        OwnerProbe(clock=lambda: 0.0),
        clock=lambda: 0.0,
        default_sharing=sharing,
    )
    await manager.start()
    await manager.set_mode("1", CardMode.TDM)
    print("ready", flush=True)
    owner = Owner(OwnerKind.LEASE, holder="crash")
    i = 0
    while True:
        i += 1
        p = await manager.create(CreateRequest(owner=owner, gpu="1", compute_percent=1, memory_mib=128))
        print(f"created {p.id}", flush=True)
        if i % 3 == 0:
            victim = manager.list_partitions()[0].id
            await manager.delete(victim)
            print(f"deleted {victim}", flush=True)
        if len(manager.list_partitions()) >= 90:
            for q in manager.list_partitions()[:45]:
                await manager.delete(q.id)
                print(f"deleted {q.id}", flush=True)


if __name__ == "__main__":
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the protocol
    asyncio.run(main(Path(sys.argv[1]), SharingPolicy(sys.argv[2] if len(sys.argv) > 2 else "isolated")))
