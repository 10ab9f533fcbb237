"""The DRA driver's only way to the Kubernetes API server: this node's ResourceSlices, ResourceClaims, the Node.

Built on the official ``kubernetes`` client (ResourceV1Api, CoreV1Api; its 37.x models are Kubernetes 1.37's
resource.k8s.io/v1, typed). Credentials: a kubeconfig file, or in-cluster (the pod's service account) without one.

Publishing follows what k8s.io/dynamic-resource-allocation's resourceslice controller does for a node-local pool:
slices are matched by name; when anything in the pool changed, every slice is written with a new pool generation
(one above the highest seen), then slices that are no longer part of the pool are deleted. An update names the
resourceVersion it read; a 409 Conflict (someone else wrote in between) reads again and retries. A taint's
timeAdded that the server filled in is carried over, so republishing never restarts a NoExecute eviction clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client import models as k

from container.dra import names
from container.dra.slices import Pool

CONFLICT_RETRIES = 5


class WatchExpiredError(Exception):
    """A watch's resourceVersion is too old (410 Gone/Expired): list again and watch from the list's version."""


@dataclass(frozen=True, slots=True)
class Published:
    generation: int
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


@dataclass(frozen=True, slots=True)
class ClaimEvent:
    type: str  # ADDED, MODIFIED, DELETED
    claim: k.ResourceV1ResourceClaim


def load_config(kubeconfig: str | None) -> client.Configuration:
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


class KubeApi:
    def __init__(self, api_client: client.ApiClient, node_name: str, driver: str = names.DRIVER) -> None:
        self._client = api_client
        self._resource = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.driver = driver

    @classmethod
    def connect(cls, node_name: str, kubeconfig: str | None = None) -> KubeApi:
        return cls(client.ApiClient(load_config(kubeconfig)), node_name)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    # ----- the Node --------------------------------------------------------------------------------------------

    def node_uid(self) -> str:
        node = self._core.read_node(self.node_name)
        if node.metadata is None or not node.metadata.uid:
            raise ValueError(f"node {self.node_name} has no uid")
        return node.metadata.uid

    # ----- ResourceSlices --------------------------------------------------------------------------------------

    @property
    def _own(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver}"

    def slices(self) -> list[k.V1ResourceSlice]:
        """This node's slices of this driver."""
        return list(self._resource.list_resource_slice(field_selector=self._own).items)

    def publish(self, build: Callable[[int], Pool]) -> Published:
        """Make the pool ``build(generation)`` describes the one the API server has."""
        for _ in range(CONFLICT_RETRIES):
            try:
                return self._publish_once(build)
            except client.ApiException as e:
                if e.status != 409:
                    raise
        raise RuntimeError(f"ResourceSlices of {self.node_name}: still conflicting after {CONFLICT_RETRIES} tries")

    def _publish_once(self, build: Callable[[int], Pool]) -> Published:
        existing = {s.metadata.name: s for s in self.slices() if s.metadata is not None and s.metadata.name}
        current = max((s.spec.pool.generation for s in existing.values()), default=0)
        desired = build(max(current, 1))
        for s in desired.slices:
            _carry_time_added(s, existing.get(_name(s)))
        if current and _same_pool(desired, existing):
            return Published(current)
        generation = current + 1
        desired = build(generation)
        created, updated = [], []
        for s in desired.slices:
            _carry_time_added(s, existing.get(_name(s)))
            old = existing.get(_name(s))
            if old is None:
                self._resource.create_resource_slice(s)
                created.append(_name(s))
            else:
                _meta(s).resource_version = _meta(old).resource_version
                self._resource.replace_resource_slice(_name(s), s)
                updated.append(_name(s))
        wanted = {_name(s) for s in desired.slices}
        deleted = []
        for name, old in existing.items():
            if name not in wanted:
                assert old.metadata is not None
                options = k.V1DeleteOptions(
                    preconditions=k.V1Preconditions(resource_version=old.metadata.resource_version)
                )
                try:
                    self._resource.delete_resource_slice(name, body=options)
                except client.ApiException as e:
                    if e.status != 404:
                        raise
                deleted.append(name)
        return Published(generation, tuple(created), tuple(updated), tuple(deleted))

    def delete_slices(self) -> None:
        """Every slice of this node and driver (what kubelet also does when the plugin is gone for good)."""
        self._resource.delete_collection_resource_slice(field_selector=self._own)

    # ----- ResourceClaims --------------------------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> k.ResourceV1ResourceClaim:
        return self._resource.read_namespaced_resource_claim(name, namespace)

    def claims(self) -> tuple[list[k.ResourceV1ResourceClaim], str]:
        """Every claim in the cluster and the resourceVersion to watch from."""
        listing = self._resource.list_resource_claim_for_all_namespaces()
        version = listing.metadata.resource_version if listing.metadata is not None else None
        return list(listing.items), version or ""

    def watch_claims(self, resource_version: str, timeout_seconds: int = 300) -> Iterator[ClaimEvent]:
        """Claim changes after ``resource_version`` until the server ends the watch (WatchExpiredError: too old)."""
        # The client's Watch finds the item type by dropping "List" from the list's (V1ResourceClaimList), but the
        # claim model is ResourceV1ResourceClaim (V1ResourceClaim is core/v1's container claim): name it.
        watcher = watch.Watch(return_type=k.ResourceV1ResourceClaim)  # type: ignore[no-untyped-call]
        stream: Any = watcher.stream(  # type: ignore[no-untyped-call]
            self._resource.list_resource_claim_for_all_namespaces,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )
        try:
            for event in stream:
                if event["type"] == "ERROR":
                    raise client.ApiException(status=event["raw_object"].get("code"), reason="watch error")
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    yield ClaimEvent(event["type"], event["object"])
        except client.ApiException as e:
            if e.status == 410:
                raise WatchExpiredError(str(e)) from e
            raise


def _meta(s: k.V1ResourceSlice) -> k.V1ObjectMeta:
    if s.metadata is None:
        raise ValueError("a ResourceSlice without metadata")
    return s.metadata


def _name(s: k.V1ResourceSlice) -> str:
    name = _meta(s).name
    if not name:
        raise ValueError("a ResourceSlice without a name")
    return name


def _spec(s: k.V1ResourceSlice) -> tuple[object, object]:
    """The slice as JSON (its spec and owners), without what the pool generation and the server change."""
    body = to_json(s.spec)
    body.get("pool", {}).pop("generation", None)
    return body, to_json(s.metadata.owner_references if s.metadata is not None else None)


def to_json(model: object) -> Any:
    """A client model as the JSON the API server sees (camelCase, unset fields left out)."""
    return client.ApiClient().sanitize_for_serialization(model)  # type: ignore[no-untyped-call]


def _same_pool(desired: Pool, existing: dict[str, k.V1ResourceSlice]) -> bool:
    if {_name(s) for s in desired.slices} != set(existing):
        return False
    return all(_spec(s) == _spec(existing[_name(s)]) for s in desired.slices)


def _carry_time_added(desired: k.V1ResourceSlice, old: k.V1ResourceSlice | None) -> None:
    if old is None or old.spec is None or desired.spec is None or not old.spec.devices or not desired.spec.devices:
        return
    before = {
        (d.name, t.key, t.value, t.effect): t.time_added
        for d in old.spec.devices
        for t in d.taints or ()
        if t.time_added
    }
    for device in desired.spec.devices:
        for taint in device.taints or ():
            if taint.time_added is None:
                taint.time_added = before.get((device.name, taint.key, taint.value, taint.effect))
