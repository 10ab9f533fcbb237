"""Leases run for the time they were given, whatever the wall clock does: a step forward does not reclaim a
lease early, a step back does not keep one late. The wall clock and the monotonic one are moved by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from healthd.partition.cdi import CdiWriter
from healthd.partition.clock_steps import ClockSteps
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.settings import PartitionSettings
from healthd.partition.store import Store
from tests.support.clock import FakeClock
from tests.support.partition_node import Node

LEASE = Owner(OwnerKind.LEASE, holder="job")


def manager(node: Node, monotonic: FakeClock) -> PartitionManager:
    return PartitionManager(
        node.backend,
        Store(node.state_file),
        MpsSupervisor(SimulatedMpsControl(), node.root / "run"),
        CdiWriter(node.cdi_dir),
        OwnerProbe(cgroup_root=node.root / "cgroup", clock=node.clock),
        settings=PartitionSettings(owner_grace_seconds=0.0),
        clock=node.clock,
        monotonic=monotonic,
    )


def both(node: Node, monotonic: FakeClock, seconds: float) -> None:
    """Time passes: both clocks move."""
    node.clock.advance(seconds)
    monotonic.advance(seconds)


def test_steps_forward_and_back_do_not_move_leases(make_node: Callable[[str], Node]) -> None:
    node = make_node("h200x8")
    mono = FakeClock(5_000.0)
    m = manager(node, mono)

    async def go() -> None:
        await m.start()
        await m.set_mode("2", CardMode.TDM)
        hour = await m.create(CreateRequest(LEASE, "2", 10, 0, lease_ttl_seconds=3600))
        both(node, mono, 10)
        node.clock.advance(2 * 3600)  # +2 h step
        both(node, mono, 12)
        assert await m.reconcile() == [], "a 1 h lease reclaimed 22 s after it was made"
        assert m.get(hour.id).lease_expires_at == pytest.approx(hour.lease_expires_at + 2 * 3600)
        short = await m.create(CreateRequest(LEASE, "2", 10, 0, lease_ttl_seconds=5))
        node.clock.advance(-2 * 3600)  # -2 h step
        both(node, mono, 6)
        assert await m.reconcile() == [short.id], "a 5 s lease kept after it ran out"
        renewed = await m.renew_lease(hour.id, 60)
        assert renewed.lease_expires_at == pytest.approx(node.clock() + 60)
        both(node, mono, 61)
        assert await m.reconcile() == [hour.id]
        with pytest.raises(PartitionError) as gone:
            m.get(hour.id)
        assert gone.value.kind is Kind.NOT_FOUND
        await m.close()

    asyncio.run(go())


def test_a_step_is_told_from_drift() -> None:
    wall, mono = FakeClock(100.0), FakeClock(0.0)
    steps = ClockSteps(wall, mono)
    wall.advance(10.5)
    mono.advance(10.0)
    assert steps.step() == 0.0  # half a second: drift, or a late pass
    wall.advance(-30)
    assert steps.step() == -30.0
    assert steps.step() == 0.0
