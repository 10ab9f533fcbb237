"""Owners and reclaim: dead processes, removed cgroups, pods gone from the kubelet, expired leases; MPS restarts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.mps import MpsError, SimulatedMpsControl
from healthd.partition.mps_spec import MpsDaemonSpec
from healthd.partition.owners import OwnerProbe, process_start_ticks
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import SharingPolicy, shared_daemon_id
from tests.support.clock import FakeClock
from tests.support.partition_node import Node

CID = "0123456789abcdef" * 4


def test_process_start_ticks_handles_odd_names(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    fields = " ".join(str(i) for i in range(4, 60))  # fields 4.. after the state
    (tmp_path / "42" / "stat").write_text(f"42 (a) b (c)) S {fields}\n")
    assert process_start_ticks(tmp_path, 42) == 22  # field 22 counted after the last ')'
    assert process_start_ticks(tmp_path, 43) is None


def test_owner_probe_kinds(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    pods = {("ns", "alive"): True, ("ns", "gone"): False}
    probe = OwnerProbe(cgroup_root=tmp_path, pod_exists=lambda n, p: pods.get((n, p)), clock=clock)
    (tmp_path / "kubepods.slice" / f"cri-containerd-{CID}.scope").mkdir(parents=True)
    assert probe.alive(Owner(OwnerKind.CONTAINER, container_id=CID), 0) is True
    assert probe.alive(Owner(OwnerKind.CONTAINER, container_id="f" * 64), 0) is False
    explicit = Owner(OwnerKind.CONTAINER, container_id=CID, cgroup_path=f"/kubepods.slice/cri-containerd-{CID}.scope")
    assert probe.alive(explicit, 0) is True
    assert probe.alive(Owner(OwnerKind.POD, namespace="ns", pod="alive", container="c"), 0) is True
    assert probe.alive(Owner(OwnerKind.POD, namespace="ns", pod="gone", container="c"), 0) is False
    assert probe.alive(Owner(OwnerKind.POD, namespace="ns", pod="unknown", container="c"), 0) is None
    assert probe.alive(Owner(OwnerKind.LEASE, holder="h"), 150.0) is True
    clock.advance(50)
    assert probe.alive(Owner(OwnerKind.LEASE, holder="h"), 150.0) is False


def test_reclaims_partitions_whose_owner_is_gone(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        pods = {"keep": True, "drop": False}
        m = node.manager(pod_exists=lambda ns, name: pods.get(name))
        await m.start()
        await m.set_mode("1", CardMode.TDM)
        await m.set_mode("6", CardMode.MIG)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # noqa: ASYNC220
        try:
            by_pid = await m.create(
                CreateRequest(Owner(OwnerKind.PROCESS, pid=child.pid), gpu="1", compute_percent=10, memory_mib=0)
            )
            assert by_pid.owner.pid_start_ticks > 0  # recorded so a reused PID does not keep it alive
            me = await m.create(CreateRequest(Owner(OwnerKind.PROCESS, pid=1), "1", 10, 0))
            cgroup = node.root / "cgroup" / f"docker-{CID}.scope"
            cgroup.mkdir(parents=True)
            by_ctr = await m.create(CreateRequest(Owner(OwnerKind.CONTAINER, container_id=CID), "6", 10, 0))
            keep_owner = Owner(OwnerKind.POD, namespace="ns", pod="keep", container="c")
            keep = await m.create(CreateRequest(keep_owner, "1", 5, 0))
            drop = await m.create(CreateRequest(replace(keep_owner, pod="drop"), "1", 5, 0))
            leased = await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="h"), "1", 5, 0, lease_ttl_seconds=30))
            assert set(await m.reconcile()) == {drop.id}
            child.kill()
            child.wait()
            cgroup.rmdir()
            node.clock.advance(20)
            await m.renew_lease(leased.id, 30)
            reclaimed = set(await m.reconcile())
            assert reclaimed == {by_pid.id, by_ctr.id}
            assert node.backend.mig_instances(6) == ()  # the MIG instance went with its container
            node.clock.advance(31)
            assert set(await m.reconcile()) == {leased.id}
            with pytest.raises(PartitionError):
                await m.renew_lease(leased.id, 30)
            assert {p.id for p in m.list_partitions()} == {me.id, keep.id}
            assert m.reclaimed_total == 4
        finally:
            child.kill()
            child.wait()

    asyncio.run(go())


def test_grace_period_protects_new_partitions(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = node.manager(settings=PartitionSettings(owner_grace_seconds=60))
        await m.start()
        await m.set_mode("1", CardMode.TDM)
        (node.root / "cgroup").mkdir()
        # the container runtime creates the partition before the container's cgroup exists
        p = await m.create(CreateRequest(Owner(OwnerKind.CONTAINER, container_id=CID), "1", 10, 0))
        assert await m.reconcile() == []
        node.clock.advance(61)
        assert await m.reconcile() == [p.id]

    asyncio.run(go())


def test_dead_mps_daemons_are_restarted_with_their_quota(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        mps = SimulatedMpsControl()
        m = node.manager(mps=mps)
        await m.start()
        await m.set_mode("2", CardMode.TDM)
        p = await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="h"), "2", 30, 2048, lease_ttl_seconds=600))
        if node.sharing is SharingPolicy.ISOLATED:  # the quota is the partition's own daemon's ceiling
            daemon = p.id
            defaults = {"set_default_active_thread_percentage": "30", "set_default_device_pinned_mem_limit": "0 2G"}
        else:  # one daemon for the card, no ceiling; the quota travels in the client's environment
            daemon, defaults = shared_daemon_id(p.gpu_uuid), {}
        env = m.edits(p).env
        assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == ("30", "0=2G")
        assert mps.defaults(daemon) == defaults
        mps.kill(daemon)
        assert mps.running() == set()
        await m.reconcile()
        assert mps.running() == {daemon}
        assert mps.defaults(daemon) == defaults
        assert m.mps.restarts == 1
        await m.delete(p.id)
        assert mps.running() == set()
        assert not (node.root / "run" / "mps" / daemon).exists()

    asyncio.run(go())


def test_a_shared_card_keeps_its_daemon_until_its_last_partition_goes(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        mps = SimulatedMpsControl()
        m = node.manager(mps=mps)
        await m.start()
        await m.set_mode("2", CardMode.TDM, SharingPolicy.SHARED)
        assert m.capacity("2")[0].sharing == "shared"
        a = await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="a"), "2", 30, 2048, lease_ttl_seconds=600))
        b = await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="b"), "2", 70, 8192, lease_ttl_seconds=600))
        card = shared_daemon_id(a.gpu_uuid)
        assert mps.running() == {card}, "one server for both: they run side by side"
        assert m.edits(a).env["CUDA_MPS_PIPE_DIRECTORY"] == m.edits(b).env["CUDA_MPS_PIPE_DIRECTORY"]
        await m.delete(a.id)
        assert mps.running() == {card}, "b still uses it"
        with pytest.raises(PartitionError) as busy:
            await m.set_mode("2", CardMode.TDM, SharingPolicy.ISOLATED)
        assert busy.value.kind is Kind.PRECONDITION and "TDM sharing" in busy.value.message
        await m.delete(b.id)
        assert mps.running() == set()
        await m.set_mode("2", CardMode.TDM, SharingPolicy.ISOLATED)
        assert m.capacity("2")[0].sharing == "isolated"
        with pytest.raises(PartitionError) as wrong:
            await m.set_mode("3", CardMode.MIG, SharingPolicy.SHARED)
        assert wrong.value.kind is Kind.INVALID

    asyncio.run(go())


class _BrokenMps(SimulatedMpsControl):
    def start(self, spec: MpsDaemonSpec) -> None:
        raise MpsError("nvidia-cuda-mps-control -d failed (1): simulated failure")


def test_mps_failure_is_unavailable_and_leaves_nothing(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        m = node.manager(mps=_BrokenMps())
        await m.start()
        await m.set_mode("2", CardMode.TDM)
        with pytest.raises(PartitionError) as err:
            await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="h"), "2", 30, 0))
        assert err.value.kind is Kind.UNAVAILABLE
        assert "simulated failure" in err.value.message
        assert m.list_partitions() == []
        assert m.store.all() == []
        assert m.capacity("2")[0].compute_percent_allocated == 0

    asyncio.run(go())
