"""container/dra/kubeapi.py against the API server stand-in, through the official client: the node's pool is
published, kept, replaced and removed as the resourceslice controller does it, and claims are read and watched."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client
from kubernetes.client import models as k

from container.dra.kubeapi import KubeApi, WatchExpiredError, to_json
from container.dra.slices import Pool, slice_name
from tests.support.kube_api import KubeApiServer

NODE = "node-a"
DRIVER = "gpu.xpu-runtime-kit.io"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 9, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=7)
        return self.now


@pytest.fixture
def server() -> Iterator[KubeApiServer]:
    with KubeApiServer(clock=Clock()) as srv:
        srv.add("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


@pytest.fixture
def kube(server: KubeApiServer) -> Iterator[KubeApi]:
    api = KubeApi(client.ApiClient(client.Configuration(host=server.url)), NODE)
    yield api
    api.close()


def device(name: str, taint: str | None = None) -> k.V1Device:
    taints = [k.V1DeviceTaint(key="xpu-runtime-kit.io/fault", value=taint, effect="NoSchedule")] if taint else None
    return k.V1Device(name=name, attributes={"index": k.V1DeviceAttribute(int=int(name[4:]))}, taints=taints)


def pool(*chunks: list[k.V1Device]) -> Callable[[int], Pool]:
    def build(generation: int) -> Pool:
        return Pool(
            NODE,
            tuple(
                k.V1ResourceSlice(
                    api_version="resource.k8s.io/v1",
                    kind="ResourceSlice",
                    metadata=k.V1ObjectMeta(name=slice_name(NODE, i)),
                    spec=k.V1ResourceSliceSpec(
                        driver=DRIVER,
                        node_name=NODE,
                        pool=k.V1ResourcePool(name=NODE, generation=generation, resource_slice_count=len(chunks)),
                        devices=[d.model_copy(deep=True) for d in chunk],
                    ),
                )
                for i, chunk in enumerate(chunks)
            ),
        )

    return build


def test_a_pool_is_created_kept_and_replaced_with_a_new_generation(server: KubeApiServer, kube: KubeApi) -> None:
    first = kube.publish(pool([device("gpu-0"), device("gpu-1")], [device("gpu-2")]))
    assert (first.generation, len(first.created), first.updated, first.deleted) == (1, 2, (), ())
    assert kube.publish(pool([device("gpu-0"), device("gpu-1")], [device("gpu-2")])).changed is False

    second = kube.publish(pool([device("gpu-0", taint="xid_79"), device("gpu-1")]))
    assert (second.generation, second.updated, second.deleted) == (2, (slice_name(NODE, 0),), (slice_name(NODE, 1),))
    (only,) = server.items("resourceslices")
    assert only["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert only["spec"]["devices"][0]["taints"][0]["value"] == "xid_79"
    assert server.rejected == []


def test_republishing_keeps_the_time_the_server_gave_a_taint(server: KubeApiServer, kube: KubeApi) -> None:
    kube.publish(pool([device("gpu-0", taint="xid_79"), device("gpu-1")]))
    stamped = server.items("resourceslices")[0]["spec"]["devices"][0]["taints"][0]["timeAdded"]
    kube.publish(pool([device("gpu-0", taint="xid_79"), device("gpu-1", taint="gpu_lost")]))
    devices = server.items("resourceslices")[0]["spec"]["devices"]
    assert devices[0]["taints"][0]["timeAdded"] == stamped
    assert devices[1]["taints"][0]["timeAdded"] != stamped  # a new taint gets the server's time


def test_a_conflicting_writer_is_read_again_and_the_pool_still_lands(server: KubeApiServer, kube: KubeApi) -> None:
    kube.publish(pool([device("gpu-0")]))
    build = pool([device("gpu-0", taint="xid_48")])
    calls = 0

    def racing(generation: int) -> Pool:
        nonlocal calls
        calls += 1
        if calls == 2:  # between our read and our write someone else updates the slice
            theirs = server.get("resourceslices", slice_name(NODE, 0))
            theirs["spec"]["devices"][0]["attributes"]["index"]["int"] = 9
            server.update("resourceslices", theirs)
        return build(generation)

    done = kube.publish(racing)
    assert calls > 2 and done.updated == (slice_name(NODE, 0),)
    assert server.items("resourceslices")[0]["spec"]["devices"][0]["attributes"]["index"] == {"int": 0}
    assert ("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(NODE, 0)}") in server.requests


def test_only_this_nodes_slices_are_touched(server: KubeApiServer, kube: KubeApi) -> None:
    other = to_json(pool([device("gpu-0")])(1).slices[0])
    other["metadata"]["name"] = "node-b-slice"
    other["spec"].update(nodeName="node-b", pool={"name": "node-b", "generation": 3, "resourceSliceCount": 1})
    server.add("resourceslices", other)
    kube.publish(pool([device("gpu-0")]))
    assert [s.metadata.name for s in kube.slices()] == [slice_name(NODE, 0)]
    kube.delete_slices()
    assert [s["metadata"]["name"] for s in server.items("resourceslices")] == ["node-b-slice"]


def test_an_invalid_slice_is_refused_by_both_schemas(server: KubeApiServer, kube: KubeApi) -> None:
    bad = pool([k.V1Device(name="gpu-0", node_allocatable_resources={"cpu": k.V1NodeAllocatableResource()})])
    with pytest.raises(client.ApiException) as refused:
        kube.publish(bad)
    assert refused.value.status == 422
    assert "1.36" in server.rejected[0][1] and "nodeAllocatableResources" in server.rejected[0][1]


def test_the_node_uid_is_the_servers(server: KubeApiServer, kube: KubeApi) -> None:
    assert kube.node_uid() == server.get("nodes", NODE)["metadata"]["uid"]


CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c1", "namespace": "team"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.xpu-runtime-kit.io"}}]}},
}


def test_claims_are_read_and_watched_with_their_status(server: KubeApiServer, kube: KubeApi) -> None:
    server.add("resourceclaims", CLAIM, "team")
    claims, version = kube.claims()
    assert [c.metadata.name for c in claims] == ["c1"]
    seen: list[tuple[str, bool]] = []
    watcher = threading.Thread(
        target=lambda: seen.extend(
            (e.type, e.claim.status is not None and e.claim.status.allocation is not None)
            for e in kube.watch_claims(version, timeout_seconds=2)
        )
    )
    watcher.start()
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}}
    server.set_status("resourceclaims", "c1", {"allocation": allocation}, "team")
    assert kube.claim("team", "c1").status.allocation.devices.results[0].device == "gpu-0"
    server.delete("resourceclaims", "c1", "team")
    watcher.join()
    assert seen == [("MODIFIED", True), ("DELETED", True)]


def test_a_watch_from_a_compacted_version_says_to_list_again(server: KubeApiServer, kube: KubeApi) -> None:
    server.add("resourceclaims", CLAIM, "team")
    _, version = kube.claims()
    server.add("resourceclaims", {**CLAIM, "metadata": {"name": "c2", "namespace": "team"}}, "team")
    server.store.compact()
    with pytest.raises(WatchExpiredError):
        list(kube.watch_claims(version, timeout_seconds=1))
