"""NodePrepareResources and NodeUnprepareResources for one claim, and the reconcile on start.

Prepare reads the claim's allocation from the API server (kubelet sends only namespace, name and uid) and, for each
result of this driver in this node's pool, makes what the device name says (container/dra/slices.py names them):

- ``gpu-<i>``: the whole card; its CDI device is the card's own in the daemon's spec, no partition.
- ``gpu-<i>-tdm``: a TDM partition with the quotas the scheduler recorded in ``consumedCapacity`` (compute percent
  and memory; a claim that left one out was given the request policy's default, the whole of it).
- ``gpu-<i>-mig-<profile>-<start>``: a MIG instance of that profile at that placement.

Each partition is owned by the claim (the daemon never reclaims it) and asked for with a request id made of the
claim uid, the device and the share id, so a retry, a restart or a concurrent call gets the same partition. Calls
for one claim run one at a time; different claims run in parallel (the daemon serialises per card). Unprepare
deletes every partition the daemon lists for the claim's uid, so it also cleans up after a prepare cut short.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace

import grpc
import structlog
from kubernetes import client
from kubernetes.client import models as k

from container.core.daemon_client import DaemonClient
from container.core.inventory import Inventory, card_cdi_device
from container.core.ownership import claim_uid_of
from container.dra import names
from container.dra.checkpoint import PREPARED, PREPARING, Checkpoint, ClaimEntry, PreparedDevice
from container.dra.kubeapi import KubeApi
from container.dra.mig_devices import profile_slug
from container.dra.quantity import parse_quantity
from healthd.api.v1 import partitions_pb2

log = structlog.get_logger("dra.prepare")

MIB = 1 << 20
MAX_REQUEST_ID = 128  # the daemon's limit
_WHOLE = re.compile(r"gpu-(\d+)")
_TDM = re.compile(r"gpu-(\d+)-tdm")
_MIG = re.compile(r"gpu-(\d+)-mig-([a-z0-9-]+)-(\d+)")


class PrepareError(Exception):
    """Why one claim could not be prepared or unprepared: kubelet shows it on the pod and tries again."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


def request_id(uid: str, device: str, share_id: str) -> str:
    """The daemon's idempotency key for one allocated device of a claim."""
    readable = f"{uid}/{device}" + (f"/{share_id}" if share_id else "")
    if len(readable) <= MAX_REQUEST_ID:
        return readable
    return f"{uid}/{hashlib.sha256(readable.encode()).hexdigest()[:32]}"


def _compute_percent(quantity: str | None) -> int:
    if quantity is None:
        return 100  # the request policy's default: the claim takes all of it
    value = parse_quantity(quantity)
    return min(100, max(1, math.ceil(value)))


def _memory(quantity: str | None, card_bytes: int) -> str:
    value = card_bytes if quantity is None else math.ceil(parse_quantity(quantity))
    mib = -(-value // MIB)
    return f"{mib}MiB"


@contextmanager
def _refusal_as_prepare_error() -> Iterator[None]:
    """The daemon's refusal of a partition, as the error kubelet shows on the pod."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise PrepareError(f"the daemon refused the partition: {exc.code().name}: {exc.details()}") from None


def allocated_here(claim: k.ResourceV1ResourceClaim, node: str) -> list[k.V1DeviceRequestAllocationResult]:
    """This driver's results in this node's pool, in the order the scheduler wrote them."""
    allocation = claim.status.allocation if claim.status is not None else None
    if allocation is None or allocation.devices is None:
        return []
    return [r for r in allocation.devices.results or () if r.driver == names.DRIVER and r.pool == node]


class Preparer:
    def __init__(
        self,
        daemon: DaemonClient,
        inventory: Inventory,
        kube: KubeApi,
        checkpoint: Checkpoint,
        node_name: str,
    ) -> None:
        self._daemon = daemon
        self._inventory = inventory
        self._kube = kube
        self._checkpoint = checkpoint
        self._node = node_name
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def _claim_lock(self, uid: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(uid, (asyncio.Lock(), 0))
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users == 1:
                del self._locks[uid]
            else:
                self._locks[uid] = (lock, users - 1)

    # ----- prepare ---------------------------------------------------------------------------------------------

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        async with self._claim_lock(ref.uid):
            entry = self._checkpoint.claims.get(ref.uid)
            if entry is not None and entry.state == PREPARED:
                return entry.devices
            claim = await self._read_claim(ref)
            results = allocated_here(claim, self._node)
            if not results:
                raise PrepareError(f"claim {ref.namespace}/{ref.name} has no allocation of {names.DRIVER} on this node")
            self._checkpoint.put(ref.uid, ClaimEntry(ref.namespace, ref.name, PREPARING))
            if not self._inventory.loaded:
                await self._inventory.refresh()
            devices: list[PreparedDevice] = []
            for result in results:  # one by one: a failure leaves the rest to the retry
                devices.append(await self._prepare_device(ref, result))  # noqa: PERF401
            prepared = tuple(devices)
            self._checkpoint.put(ref.uid, ClaimEntry(ref.namespace, ref.name, PREPARED, prepared))
            log.info("claim prepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, devices=len(prepared))
            return prepared

    async def _read_claim(self, ref: ClaimRef) -> k.ResourceV1ResourceClaim:
        try:
            claim = await asyncio.to_thread(self._kube.claim, ref.namespace, ref.name)
        except client.ApiException as exc:
            raise PrepareError(f"reading claim {ref.namespace}/{ref.name}: {exc.status} {exc.reason}") from None
        uid = claim.metadata.uid if claim.metadata is not None else None
        if uid != ref.uid:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} now has uid {uid}, not {ref.uid}: it was re-created")
        return claim

    async def _prepare_device(self, ref: ClaimRef, result: k.V1DeviceRequestAllocationResult) -> PreparedDevice:
        share = result.share_id or ""
        base = PreparedDevice((result.request,), result.pool, result.device, cdi_device_ids=(), share_id=share)
        if match := _WHOLE.fullmatch(result.device):
            uuid = self._card(int(match.group(1))).gpu_uuid
            return replace(base, cdi_device_ids=(card_cdi_device(uuid),))
        claim = (ref.namespace, ref.name, ref.uid)
        rid = request_id(ref.uid, result.device, share)
        if match := _TDM.fullmatch(result.device):
            card = self._card(int(match.group(1)))
            consumed = result.consumed_capacity or {}
            with _refusal_as_prepare_error():
                partition = await self._daemon.create_for_claim(
                    claim,
                    gpu_uuid=card.gpu_uuid,
                    request_id=rid,
                    compute_percent=_compute_percent(consumed.get(names.COMPUTE)),
                    memory=_memory(consumed.get(names.MEMORY), card.memory_total_bytes),
                )
        elif match := _MIG.fullmatch(result.device):
            card = self._card(int(match.group(1)))
            slug, start = match.group(2), int(match.group(3))
            profile = next((p.profile for p in card.mig_profiles if profile_slug(p.profile) == slug), None)
            if profile is None:
                raise PrepareError(f"device {result.device}: GPU {card.gpu} has no MIG profile {slug!r} now")
            with _refusal_as_prepare_error():
                partition = await self._daemon.create_for_claim(
                    claim, gpu_uuid=card.gpu_uuid, request_id=rid, mig_profile=profile, mig_placement_start=start
                )
        else:
            raise PrepareError(f"device {result.device!r} is not one this driver publishes")
        if partition.state != "ready" or not partition.cdi_device:
            raise PrepareError(f"device {result.device}: partition {partition.id} is {partition.state}, not ready")
        return replace(base, cdi_device_ids=(partition.cdi_device,), partition_id=partition.id)

    def _card(self, index: int) -> partitions_pb2.CardCapacity:
        card = next((c for c in self._inventory.view.capacity if c.gpu == index), None)
        if card is None:
            raise PrepareError(f"this node has no GPU {index}")
        return card

    # ----- unprepare -------------------------------------------------------------------------------------------

    async def unprepare(self, ref: ClaimRef) -> None:
        async with self._claim_lock(ref.uid):
            await self._delete_for(ref.uid)
            self._checkpoint.drop(ref.uid)
            log.info("claim unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)

    async def _delete_for(self, uid: str) -> int:
        entry = self._checkpoint.claims.get(uid)
        ids = {d.partition_id for d in entry.devices if d.partition_id} if entry is not None else set()
        try:
            ids |= {p.id for p in await self._daemon.partitions() if claim_uid_of(p) == uid}
            for partition_id in sorted(ids):
                await self._daemon.delete_partition(partition_id)
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
            raise PrepareError(f"the daemon did not delete the partitions: {why}") from None
        return len(ids)

    # ----- reconcile -------------------------------------------------------------------------------------------

    async def reconcile(self) -> list[str]:
        """Delete the partitions (and forget the checkpoint entries) of claims that are gone or no longer allocated
        here; keep everything of claims that still are. The uids cleaned up."""
        claims, _ = await asyncio.to_thread(self._kube.claims)
        live = {c.metadata.uid for c in claims if c.metadata is not None and allocated_here(c, self._node)}
        owned = {uid for p in await self._daemon.partitions() if (uid := claim_uid_of(p)) is not None}
        gone = sorted((owned | set(self._checkpoint.claims)) - live)
        for uid in gone:
            async with self._claim_lock(uid):
                count = await self._delete_for(uid)
                self._checkpoint.drop(uid)
            log.info("claim gone; its partitions deleted", uid=uid, partitions=count)
        return gone
