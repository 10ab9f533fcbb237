"""Dynamic MIG through the manager on the simulated H200 node: modes, profiles, placement, in-use destroy, restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind, State
from healthd.partition.settings import PartitionSettings
from tests.support.partition_node import Node

LEASE = Owner(OwnerKind.LEASE, holder="test")


def req(gpu: str, compute: int = 0, memory_mib: int = 0, request_id: str = "") -> CreateRequest:
    return CreateRequest(owner=LEASE, gpu=gpu, compute_percent=compute, memory_mib=memory_mib, request_id=request_id)


async def started(node: Node, **kw: object) -> PartitionManager:
    m = node.manager(**kw)  # type: ignore[arg-type]
    await m.start()
    return m


def test_mig_mode_needs_hardware_mig(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        m = await started(make_node("h200x8"))
        with pytest.raises(PartitionError) as err:
            await m.set_mode("0", CardMode.MIG)
        assert err.value.kind is Kind.PRECONDITION
        assert "nvidia-smi -i 0 -mig 1" in err.value.message
        # nvidia-smi refuses while any NVML client holds the card: the daemon and its MPS daemons go first
        stop = err.value.message.index("systemctl stop xpu-healthd 'xpu-mps-*'")
        assert stop < err.value.message.index("nvidia-smi -i 0 -mig 1") < err.value.message.index("systemctl start")
        with pytest.raises(PartitionError) as err:
            await m.set_mode("6", CardMode.TDM)  # MIG is on in hardware: TDM needs the whole card
        assert err.value.kind is Kind.PRECONDITION
        assert "-mig 0" in err.value.message
        assert err.value.message.index("systemctl stop xpu-healthd 'xpu-mps-*'") < err.value.message.index("-mig 0")
        cap = await m.set_mode("6", CardMode.MIG)
        assert cap.mode is CardMode.MIG
        assert cap.mig_memory_slices_free == 8

    asyncio.run(go())


def test_create_maps_to_profile_and_creates_the_instance(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = await started(node)
        await m.set_mode("6", CardMode.MIG)
        p = await m.create(req("6", compute=10))
        assert p.state is State.READY
        assert p.mig is not None
        assert p.mig.profile_name == "1g.18gb"
        instances = node.backend.mig_instances(6)
        assert [(i.uuid, i.profile_name) for i in instances] == [(p.mig.uuid, "1g.18gb")]
        edits = m.edits(p)
        assert edits.env["CUDA_VISIBLE_DEVICES"] == p.mig.uuid
        big = await m.create(req("6", compute=48))
        assert big.mig is not None
        assert (big.mig.profile_name, big.mig.placement_start) == ("4g.71gb", 0)  # the small one left room at 0

    asyncio.run(go())


def test_fragmentation_after_deletes_is_reused(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = await started(node)
        await m.set_mode("6", CardMode.MIG)
        smalls = [await m.create(req("6", compute=10)) for _ in range(7)]
        with pytest.raises(PartitionError) as err:
            await m.create(req("6", compute=10))
        assert err.value.kind is Kind.EXHAUSTED
        # free two neighbouring slices that form a legal 2g/1g.35gb placement, then ask for 20 %
        by_start = {p.mig.placement_start: p for p in smalls if p.mig}
        await m.delete(by_start[2].id)
        await m.delete(by_start[3].id)
        p = await m.create(req("6", compute=20))
        assert p.mig is not None
        assert (p.mig.profile_name, p.mig.placement_start) == ("2g.35gb", 2)
        with pytest.raises(PartitionError) as err:
            await m.create(req("6", compute=20))
        assert err.value.kind is Kind.EXHAUSTED

    asyncio.run(go())


def test_delete_retries_while_in_use(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = await started(node, settings=PartitionSettings(owner_grace_seconds=0))
        await m.set_mode("6", CardMode.MIG)
        p = await m.create(req("6", compute=10))
        assert p.mig is not None
        node.backend.inject("process_start", 6, {"pid": "777", "gpu_instance_id": str(p.mig.gpu_instance_id)})
        with pytest.raises(PartitionError) as err:
            await m.delete(p.id)
        assert err.value.kind is Kind.PRECONDITION
        assert "in use" in err.value.message
        assert m.get(p.id).state is State.DELETING  # kept, still counted: the instance still holds its slices
        assert len(node.backend.mig_instances(6)) == 1
        # a retrying delete succeeds once the process exits in the middle of the retries
        m.destroy_retry_seconds = 30.0

        async def exit_later() -> None:
            await asyncio.sleep(0.2)
            node.backend.inject("process_exit", 6, {"pid": "777"})

        m.clock = _real_clock()
        task = asyncio.create_task(exit_later())
        assert await m.delete(p.id) is True
        await task
        assert node.backend.mig_instances(6) == ()
        with pytest.raises(PartitionError):
            m.get(p.id)

    asyncio.run(go())


def _real_clock() -> Callable[[], float]:
    import time

    return time.monotonic


def test_reconciler_finishes_an_in_use_delete(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = await started(node)
        await m.set_mode("6", CardMode.MIG)
        p = await m.create(req("6", compute=10))
        assert p.mig is not None
        node.backend.inject("process_start", 6, {"pid": "778", "gpu_instance_id": str(p.mig.gpu_instance_id)})
        with pytest.raises(PartitionError):
            await m.delete(p.id)
        assert await m.reconcile() == []
        node.backend.inject("process_exit", 6, {"pid": "778"})
        assert await m.reconcile() == [p.id]
        assert node.backend.mig_instances(6) == ()

    asyncio.run(go())


def test_restart_adopts_own_reports_foreign_and_never_destroys_them(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m1 = await started(node)
        await m1.set_mode("7", CardMode.MIG)  # GPU 7 holds two instances an operator made by hand
        foreign_uuids = {i.uuid for i in node.backend.mig_instances(7)}
        assert len(foreign_uuids) == 2
        assert {i.uuid for i in m1.capacity("7")[0].foreign} == foreign_uuids
        ours = await m1.create(req("7", memory_mib=16384))
        assert ours.mig is not None
        # the daemon dies without stopping anything; a new one starts on the same GPUs and state file
        m2 = await started(node)
        assert m2.get(ours.id).mig == ours.mig
        cap = m2.capacity("7")[0]
        assert cap.mode is CardMode.MIG
        assert {i.uuid for i in cap.foreign} == foreign_uuids
        assert cap.partitions == 1
        await m2.delete(ours.id)
        assert {i.uuid for i in node.backend.mig_instances(7)} == foreign_uuids  # foreign ones untouched
        # the foreign instances block placements: the 3g at 0 and 2g at 4 leave slices 6-7
        with pytest.raises(PartitionError) as err:
            await m2.create(req("7", compute=45))
        assert err.value.kind is Kind.EXHAUSTED

    asyncio.run(go())


def test_restart_resolves_rows_left_in_flight(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m1 = await started(node)
        await m1.set_mode("6", CardMode.MIG)
        kept = await m1.create(req("6", compute=10))
        gone = await m1.create(req("6", compute=10))
        half = await m1.create(req("6", compute=10))
        assert kept.mig is not None
        assert gone.mig is not None
        assert half.mig is not None
        # crash points: an instance destroyed behind our back; a row whose create had not recorded its result;
        node.backend.destroy_mig_instance(6, gone.mig.gpu_instance_id)
        from dataclasses import replace

        m1.store.update(replace(half, state=State.CREATING, mig=replace(half.mig, uuid="", gpu_instance_id=0)))
        deleting = await m1.create(req("6", compute=10))
        assert deleting.mig is not None
        m1.store.update(replace(deleting, state=State.DELETING))
        m2 = await started(node)
        ids = {p.id for p in m2.list_partitions()}
        assert ids == {kept.id, half.id}
        assert m2.get(half.id).state is State.READY
        assert m2.get(half.id).mig == half.mig  # adopted by profile and placement
        assert {i.uuid for i in node.backend.mig_instances(6)} == {kept.mig.uuid, half.mig.uuid}

    asyncio.run(go())


def test_create_any_spreads_over_partitionable_cards(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        m = await started(make_node("h200x8"))
        with pytest.raises(PartitionError) as err:
            await m.create(req("any", compute=10))
        assert err.value.kind is Kind.PRECONDITION
        await m.set_mode("1", CardMode.TDM)
        await m.set_mode("2", CardMode.TDM)
        a = await m.create(req("any", compute=60))
        b = await m.create(req("any", compute=60))
        assert {a.gpu, b.gpu} == {1, 2}
        with pytest.raises(PartitionError) as err:
            await m.create(req("any", compute=60))
        assert err.value.kind is Kind.EXHAUSTED

    asyncio.run(go())


def test_mode_cannot_change_with_partitions(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        m = await started(make_node("h200x8"))
        await m.set_mode("1", CardMode.TDM)
        p = await m.create(req("1", compute=10))
        with pytest.raises(PartitionError) as err:
            await m.set_mode("1", CardMode.NONE)
        assert err.value.kind is Kind.PRECONDITION
        await m.delete(p.id)
        assert (await m.set_mode("1", CardMode.NONE)).mode is CardMode.NONE

    asyncio.run(go())


def test_reconcile_notices_instances_an_operator_made(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = await started(node)
        await m.set_mode("6", CardMode.MIG)
        assert m.capacity("6")[0].foreign == ()
        by_hand = node.backend.create_mig_instance(6, 0, 0)  # 7g.141gb: the whole card
        await m.reconcile()
        assert [i.uuid for i in m.capacity("6")[0].foreign] == [by_hand.uuid]
        with pytest.raises(PartitionError) as err:
            await m.create(req("6", compute=10))
        assert err.value.kind is Kind.EXHAUSTED
        assert [i.uuid for i in node.backend.mig_instances(6)] == [by_hand.uuid]

    asyncio.run(go())
