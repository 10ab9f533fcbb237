"""MIG and TDM slices end to end: Allocate creates the partition under a kubelet-device lease, the daemon gives it to
the pod once the kubelet double lists it, and reclaims it after the pod leaves kubelet's list (or when no pod ever
shows up). Slot health follows the room left on the card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from tests.kubernetes.stack import GPU, cdi_names, stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

MIG_1G = "xpu-runtime-kit.io/mig-1g.18gb"
MIG_7G = "xpu-runtime-kit.io/mig-7g.141gb"
TDM = "xpu-runtime-kit.io/tdm-25c.32gib"


def partitions(address: str) -> list[Any]:
    with grpc.insecure_channel(address) as channel:
        return list(ppb_grpc.PartitionsStub(channel).ListPartitions(ppb.ListPartitionsRequest(), timeout=10).partitions)


def serving(address: str, resource: str, device_id: str) -> Any | None:
    for p in partitions(address):
        owner = p.owner.pod if p.owner.WhichOneof("kind") == "pod" else p.owner.lease
        if (owner.kubelet_device.resource_name, owner.kubelet_device.device_id) == (resource, device_id):
            return p
    return None


def owned_by_pod(address: str, resource: str, device_id: str, pod: tuple[str, str, str]) -> bool:
    p = serving(address, resource, device_id)
    if p is None or p.owner.WhichOneof("kind") != "pod":
        return False
    return (p.owner.pod.namespace, p.owner.pod.name, p.owner.pod.container) == pod


def test_mig_and_tdm_slices_follow_their_pods(tmp_path: Path) -> None:
    shapes = '[tdm]\nshapes = [{compute_percent = 25, memory = "32GiB"}]\n'
    with stack(tmp_path, scenario="h200x8", plugin_config=shapes) as (daemon, kubelet, plugin):
        # cards 6 and 7 have MIG on in hardware: they are not whole cards
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 6, "6 whole cards")
        for gpu, mode in (("6", "mig"), ("3", "tdm")):
            done = daemon.xpuctl("partitions", "mode", gpu, mode)
            assert done.returncode == 0, done.stderr
        kubelet.wait(lambda: len(kubelet.healthy(MIG_1G)) == 7, "card 6 offers seven 1g.18gb slots")
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 5, "card 3 is no longer a whole card")
        kubelet.wait(lambda: len(kubelet.healthy(TDM)) == 4, "card 3 offers four 25 %/32 GiB slots")
        kubelet.wait(lambda: len(kubelet.healthy(MIG_7G)) == 1, "card 6 offers one 7g.141gb slot")
        assert "xpu-runtime-kit.io/mig-1g.18gb+me" not in kubelet.plugins

        # a MIG slice: made in Allocate, with a CDI name in the daemon's spec, then given to the pod
        (slot,), response = kubelet.admit("team", "train-0", "worker", MIG_1G, 1)
        assert len(response.cdi_devices) == 1 and response.cdi_devices[0].name in cdi_names(daemon)
        assert response.envs["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
        made = serving(daemon.address, MIG_1G, slot)
        assert made is not None and made.mig.profile == "1g.18gb" and made.gpu == 6
        wait_until(lambda: owned_by_pod(daemon.address, MIG_1G, slot, ("team", "train-0", "worker")), "MIG pod owner")
        kubelet.pre_start(MIG_1G, [slot])
        # the card's room changed: no 7g.141gb fits any more; the 1g slots stay 7 healthy (1 used, 6 free)
        kubelet.wait(lambda: kubelet.healthy(MIG_7G) == [], "7g slot Unhealthy")
        assert len(kubelet.healthy(MIG_1G)) == 7

        # a TDM slice
        (tdm_slot,), response = kubelet.admit("team", "infer-0", "server", TDM, 1)
        tdm = serving(daemon.address, TDM, tdm_slot)
        assert tdm is not None and (tdm.gpu, tdm.compute_percent, tdm.memory_limit_bytes) == (3, 25, 32 * 2**30)
        assert response.cdi_devices[0].name == tdm.cdi_device and tdm.cdi_device in cdi_names(daemon)
        assert response.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        wait_until(lambda: owned_by_pod(daemon.address, TDM, tdm_slot, ("team", "infer-0", "server")), "TDM pod owner")

        # more than one slice per container is refused with a reason kubelet shows on the pod
        free = [i for i in kubelet.healthy(MIG_1G) if i != slot]
        with pytest.raises(grpc.RpcError) as two:
            kubelet.allocate(MIG_1G, free[:2])
        assert two.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one slice per container" in two.value.details()

        # Allocate whose pod never appears in kubelet's list: the lease (10 s here) runs out and it is reclaimed
        orphan = free[0]
        kubelet.allocate(MIG_1G, [orphan])
        assert serving(daemon.address, MIG_1G, orphan) is not None
        wait_until(lambda: serving(daemon.address, MIG_1G, orphan) is None, "orphan reclaimed", limit=90)
        with pytest.raises(grpc.RpcError) as gone:
            kubelet.pre_start(MIG_1G, [orphan])
        assert gone.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        # the pods end: kubelet stops listing them and their partitions are reclaimed
        kubelet.remove_pod("team", "train-0")
        kubelet.remove_pod("team", "infer-0")
        wait_until(lambda: partitions(daemon.address) == [], "pod partitions reclaimed")
        kubelet.wait(lambda: len(kubelet.healthy(MIG_7G)) == 1, "card 6 whole again for a 7g")
        kubelet.wait(lambda: len(kubelet.healthy(TDM)) == 4, "card 3 free again")

        # kubelet gives the slot out again: a new pod gets a fresh partition on it
        ids, _ = kubelet.admit("team", "train-1", "worker", MIG_1G, 1)
        wait_until(lambda: owned_by_pod(daemon.address, MIG_1G, ids[0], ("team", "train-1", "worker")), "new owner")
        assert plugin.proc is not None and plugin.proc.poll() is None
