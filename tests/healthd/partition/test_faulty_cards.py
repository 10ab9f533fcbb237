"""Placement skips cards whose faults take them out of service ("any" partitions), unless the caller asks otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from healthd.faults.fault import Fault, FaultState
from healthd.faults.out_of_service import gpus_out_of_service
from healthd.findings import Action, FindingKind, GpuRef, Severity
from healthd.partition.cdi import CdiWriter
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.settings import PartitionSettings
from healthd.partition.store import Store
from tests.support.partition_node import Node


def fault(gpu: int | None, action: Action, code: str = "xid_79", state: FaultState = FaultState.ACTIVE) -> Fault:
    ref = GpuRef(gpu, f"GPU-{gpu}", "") if gpu is not None else None
    return Fault(
        id=f"flt-{gpu}-{code}",
        opened_seq=1,
        check="xid",
        code=code,
        kind=FindingKind.EVENT,
        gpu=ref,
        severity=Severity.FATAL,
        action=action,
        message="",
        evidence={},
        first_seen=0.0,
        last_seen=0.0,
        count=1,
        boot_id="boot-1",
        state=state,
    )


def test_the_out_of_service_rule() -> None:
    faults = [
        fault(0, Action.RESTART_APP),  # an application error: the card is fine
        fault(1, Action.RESET_GPU),
        fault(2, Action.REPLACE_NODE),
        fault(3, Action.NONE, code="driver_call_timeout"),  # hung, not yet escalated
        fault(4, Action.REBOOT_NODE, state=FaultState.RESOLVED),
        fault(None, Action.REBOOT_NODE),  # node-wide: names no card
        fault(5, Action.NONE, code="gpu_lost"),
    ]
    assert gpus_out_of_service(faults) == {1, 2, 3, 5}


def manager(node: Node, faulty: Callable[[], frozenset[int]]) -> PartitionManager:
    return PartitionManager(
        node.backend,
        Store(node.state_file),
        MpsSupervisor(SimulatedMpsControl(), node.root / "run"),
        CdiWriter(node.cdi_dir),
        OwnerProbe(cgroup_root=node.root / "cgroup", clock=node.clock),
        settings=PartitionSettings(owner_grace_seconds=0.0),
        destroy_retry_seconds=0.0,
        clock=node.clock,
        out_of_service=faulty,
    )


def lease() -> Owner:
    return Owner(OwnerKind.LEASE, holder="test")


def test_any_skips_faulty_cards_unless_asked(make_node: Callable[[str], Node], tmp_path: Path) -> None:
    node = make_node("h200x8")
    faulty = {2}
    m = manager(node, lambda: frozenset(faulty))

    async def run() -> None:
        await m.start()
        for gpu in (2, 3):
            await m.set_mode(str(gpu), CardMode.TDM)
        # card 2 is empty (the most free capacity, first in line) but has a replace_node fault
        for _ in range(3):
            record = await m.create(CreateRequest(lease(), "any", 20, 1024))
            assert record.gpu == 3
        faulty.add(3)
        with pytest.raises(PartitionError) as err:
            await m.create(CreateRequest(lease(), "any", 20, 1024))
        assert err.value.kind is Kind.EXHAUSTED
        assert "out of service" in err.value.message
        forced = await m.create(CreateRequest(lease(), "any", 20, 1024, allow_faulty_gpus=True))
        assert forced.gpu == 2
        named = await m.create(CreateRequest(lease(), "3", 10, 1024))  # a named card is used as asked
        assert named.gpu == 3
        faulty.clear()  # the fault resolved: the card is used again
        assert (await m.create(CreateRequest(lease(), "any", 10, 1024))).gpu == 2

    asyncio.run(run())
