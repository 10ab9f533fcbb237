"""Partitions that follow pods: a kubelet-device lease becomes its pod's, and goes when kubelet stops listing it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from exporter.attribution.kubelet import DeviceListing
from healthd.partition import planner
from healthd.partition.cdi import CdiWriter
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.reconciler import Reconciler
from healthd.partition.requests import check_owner
from healthd.partition.settings import PartitionSettings
from healthd.partition.store import Store
from tests.support.partition_node import Node

RESOURCE = "xpu-runtime-kit.io/mig-1g.18gb"
Holders = dict[tuple[str, str], tuple[str, str, str]]


def build(
    node: Node, kubelet: list[Holders | None], listed_at: list[float] | None = None
) -> tuple[PartitionManager, Reconciler]:
    """``kubelet[0]``: what kubelet lists; asked now, unless ``listed_at[0]`` says when the cached List was sent."""

    def holders() -> DeviceListing | None:
        if kubelet[0] is None:
            return None
        return DeviceListing(kubelet[0], listed_at[0] if listed_at else node.clock())

    manager = PartitionManager(
        node.backend,
        Store(node.state_file),
        MpsSupervisor(SimulatedMpsControl(), node.root / "run"),
        CdiWriter(node.cdi_dir),
        OwnerProbe(cgroup_root=node.root / "cgroup", device_holders=holders, clock=node.clock),
        settings=PartitionSettings(owner_grace_seconds=60.0),
        destroy_retry_seconds=0.0,
        clock=node.clock,
    )
    return manager, Reconciler(manager, 1.0, holders)


def claim(device_id: str) -> Owner:
    return Owner(OwnerKind.LEASE, holder="xpu-device-plugin", resource_name=RESOURCE, device_id=device_id)


def test_lease_is_rebound_to_the_pod_and_reclaimed_when_kubelet_drops_the_device(
    make_node: Callable[[str], Node],
) -> None:
    node = make_node("h200x8")
    kubelet: list[Holders | None] = [{}]
    manager, reconciler = build(node, kubelet)

    async def go() -> None:
        await manager.start()
        await manager.set_mode("6", CardMode.MIG)
        p = await manager.create(CreateRequest(claim("slot-a"), "6", 12, 16384, lease_ttl_seconds=120))
        assert await reconciler.run_once() == []
        assert manager.get(p.id).owner.kind is OwnerKind.LEASE  # kubelet does not list it yet
        kubelet[0] = None  # kubelet unreachable: nothing learned, nothing reclaimed
        node.clock.advance(30)
        assert await reconciler.run_once() == []
        kubelet[0] = {(RESOURCE, "slot-a"): ("team", "train-0", "worker")}
        assert await reconciler.run_once() == []
        owner = manager.get(p.id).owner
        assert (owner.kind, owner.namespace, owner.pod, owner.container) == (OwnerKind.POD, "team", "train-0", "worker")
        assert (owner.resource_name, owner.device_id) == (RESOURCE, "slot-a")
        assert manager.get(p.id).lease_expires_at == 0.0
        node.clock.advance(600)  # far past the lease: the pod owns it now
        assert await reconciler.run_once() == []
        # a restart keeps the new owner (it is stored)
        again = PartitionManager(
            node.backend,
            Store(node.state_file),
            MpsSupervisor(SimulatedMpsControl(), node.root / "run2"),
            CdiWriter(node.cdi_dir),
            OwnerProbe(cgroup_root=node.root / "cgroup", clock=node.clock),
            clock=node.clock,
        )
        await again.start()
        assert again.get(p.id).owner == owner
        # the device went to another pod (the first one ended): this partition is no longer that pod's
        kubelet[0] = {(RESOURCE, "slot-a"): ("team", "train-1", "worker")}
        assert await reconciler.run_once() == [p.id]
        assert node.backend.mig_instances(6) == ()

    asyncio.run(go())


def test_a_slot_reused_at_once_is_bound_only_from_a_list_asked_after_the_create(
    make_node: Callable[[str], Node],
) -> None:
    """Pod A had slot-a and ended; kubelet gave slot-a to pod B at once. The cached List, asked before B's partition
    was made, still names A: binding from it would give B's partition to A, then reclaim it under B."""
    node = make_node("h200x8")
    kubelet: list[Holders | None] = [{(RESOURCE, "slot-a"): ("team", "a", "worker")}]
    asked = [node.clock()]
    manager, reconciler = build(node, kubelet, asked)

    async def go() -> None:
        await manager.start()
        await manager.set_mode("6", CardMode.MIG)
        node.clock.advance(1)
        first = await manager.create(CreateRequest(claim("slot-a"), "6", 12, 16384, lease_ttl_seconds=120))
        node.clock.advance(1)
        asked[0] = node.clock()
        await reconciler.run_once()
        assert manager.get(first.id).owner.pod == "a"
        node.clock.advance(1)
        second = await manager.create(CreateRequest(claim("slot-a"), "6", 12, 16384, lease_ttl_seconds=120))
        node.clock.advance(5)  # A is gone, B has the slot; the cache is still the List asked before B's create
        await reconciler.run_once()
        assert manager.get(second.id).owner.kind is OwnerKind.LEASE, "bound from a List older than the partition"
        kubelet[0] = {(RESOURCE, "slot-a"): ("team", "b", "worker")}
        asked[0] = node.clock()
        await reconciler.run_once()
        assert manager.get(second.id).owner.pod == "b"
        node.clock.advance(75)  # past the owner grace: A's partition goes, B's stays with B
        reclaimed = await reconciler.run_once()
        assert first.id in reclaimed and second.id not in reclaimed
        assert manager.get(second.id).owner.pod == "b"

    asyncio.run(go())


def test_a_pod_that_never_appears_leaves_the_lease_to_run_out(make_node: Callable[[str], Node]) -> None:
    node = make_node("h200x8")
    kubelet: list[Holders | None] = [{}]
    manager, reconciler = build(node, kubelet)

    async def go() -> None:
        await manager.start()
        await manager.set_mode("6", CardMode.MIG)
        p = await manager.create(CreateRequest(claim("slot-b"), "6", 12, 16384, lease_ttl_seconds=20))
        node.clock.advance(10)
        assert await reconciler.run_once() == []
        node.clock.advance(11)
        assert await reconciler.run_once() == [p.id]
        with pytest.raises(PartitionError) as err:
            manager.get(p.id)
        assert err.value.kind is Kind.NOT_FOUND

    asyncio.run(go())


def test_kubelet_device_needs_a_lease_or_pod_owner_and_a_resource_name() -> None:
    for owner in [
        Owner(OwnerKind.PROCESS, pid=1, resource_name=RESOURCE, device_id="x"),
        Owner(OwnerKind.LEASE, holder="h", resource_name="no-domain", device_id="x"),
        Owner(OwnerKind.LEASE, holder="h", resource_name=RESOURCE, device_id=""),
        Owner(OwnerKind.POD, namespace="a", pod="b", container="c", resource_name=RESOURCE, device_id="\n"),
    ]:
        with pytest.raises(PartitionError) as err:
            check_owner(owner)
        assert err.value.kind is Kind.INVALID


def test_profile_room_on_an_h200(make_node: Callable[[str], Node]) -> None:
    profiles = make_node("h200x8").backend.mig_profiles(6)
    room = {p.name: n for p, n in planner.profile_room(profiles, [])}
    assert room == {
        "1g.18gb": 7,
        "1g.18gb+me": 1,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    }
    three = next(p for p in profiles if p.name == "3g.71gb")
    room = {p.name: n for p, n in planner.profile_room(profiles, [planner.Occupied(three.profile_id, 4, 4, 3)])}
    assert room["1g.18gb"] == 4 and room["3g.71gb"] == 1 and room["4g.71gb"] == 1 and room["7g.141gb"] == 0
    assert room["2g.35gb"] == 2
