"""The resources the plugin offers and what each kubelet call does with them.

- ``<domain>/gpu``: whole cards (device id = GPU UUID) of partition mode none with MIG off in hardware.
- ``<domain>/mig-<profile>``: MIG slices of cards in partition mode mig; ``<domain>/tdm-<N>c.<M>``: TDM slices of a
  configured size on cards in partition mode tdm. Each card has one slot per instance it could hold (device id
  ``<GPU UUID>::<n>``); a free slot is Healthy only while the card still has room for one more, so kubelet's count
  follows what can really be created. Allocate creates the partition under a short lease that names the slot;
  the daemon gives it to the pod once kubelet lists the slot (see healthd/partition/podbind.py).

Every device is Unhealthy, and Allocate is refused, while the daemon has not answered for its grace period
(container/core/liveness.py): nobody would see a fault on those cards.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.inventory import Card, NodeView
from container.core.keyed_lock import KeyedLocks
from container.core.liveness import Unmonitored
from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.config import TdmShape
from container.deviceplugin.errors import AllocationError
from container.deviceplugin.runtime_answer import RuntimeAnswer
from healthd.api.v1 import partitions_pb2

log = structlog.get_logger("container.deviceplugin.resources")

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SLOT_SEP = "::"
NICS_ANNOTATION = "xpu-runtime-kit.io/rdma-nics"
# a slot number as the plugin writes it: ASCII digits, no leading zero (so "01", "٣" or "²" name no slot)
_SLOT_NUMBER = re.compile(r"0|[1-9][0-9]{0,5}", re.ASCII)

__all__ = ["AllocationError", "Context", "Slices", "WholeCards", "parse_slot"]


def parse_slot(device_id: str) -> tuple[str, int] | None:
    """(card UUID, slot number) of a slot device id written by this plugin, else None."""
    uuid, sep, number = device_id.partition(SLOT_SEP)
    if not sep or not uuid or not _SLOT_NUMBER.fullmatch(number):
        return None
    return uuid, int(number)


def refuse_duplicates(name: str, ids: Sequence[str]) -> None:
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    if twice:
        raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: device {twice[0]!r} is asked for twice")


def check_size(name: str, size: int) -> None:
    if size < 0:
        raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: allocation size {size} is negative")


def _topology(card: Card) -> kpb.TopologyInfo | None:
    return kpb.TopologyInfo(nodes=[kpb.NUMANode(ID=card.numa_node)]) if card.numa_node is not None else None


def rdma_edits(cards: Sequence[Card], response: kpb.ContainerAllocateResponse) -> None:
    """The RDMA NICs nearest to the cards, as an annotation and env, for a NIC plugin or the job (NCCL_IB_HCA)."""
    nics = sorted({n.name: n for c in cards for n in c.nics}.values(), key=lambda n: n.name)
    if not nics:
        return
    names = ",".join(n.name for n in nics)
    response.annotations[NICS_ANNOTATION] = names
    response.envs["XPU_RDMA_NICS"] = names
    netdevs = ",".join(d for n in nics for d in n.netdevs)
    if netdevs:
        response.envs["XPU_RDMA_NETDEVS"] = netdevs


@dataclass
class Context:
    """What every resource reads: the node view, which cards are out of service, the daemon and the domain."""

    client: DaemonClient
    domain: str
    lease_seconds: float
    view: Callable[[], NodeView]
    out_of_service: Callable[[], frozenset[int]]
    changed: Callable[[], Awaitable[object]]  # refresh the view and tell kubelet (after a partition was made)
    unmonitored: Callable[[], Unmonitored | None]  # None while the daemon answers
    read_now: Callable[[float], Awaitable[NodeView]]  # read the daemon within that many seconds (raises grpc errors)
    answer: RuntimeAnswer
    probe_timeout: float = 3.0
    allocate_deadline: float = 25.0

    def refuse_unmonitored(self, name: str) -> None:
        reason = self.unmonitored()
        if reason is not None:
            raise AllocationError(grpc.StatusCode.UNAVAILABLE, f"{name}: {reason.message()}; not handing out cards")

    def health(self, healthy: bool) -> str:
        return HEALTHY if healthy and self.unmonitored() is None else UNHEALTHY


class WholeCards:
    pre_start_required = False

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.name = f"{ctx.domain}/gpu"

    def cards(self, view: NodeView) -> list[Card]:
        return [c for c in view.cards if c.mode == partitions_pb2.PARTITION_MODE_NONE and not c.hardware_mig]

    def devices(self) -> list[kpb.Device]:
        out_of_service = self.ctx.out_of_service()
        return [
            kpb.Device(ID=c.uuid, health=self.ctx.health(c.index not in out_of_service), topology=_topology(c))
            for c in self.cards(self.ctx.view())
        ]

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The daemon's best-connected set among the available healthy cards (it also leaves out faulty ones)."""
        check_size(self.name, size)
        healthy = {d.ID for d in self.devices() if d.health == HEALTHY}
        pool = list(dict.fromkeys(i for i in [*must, *available] if i in healthy or i in must))
        size = min(size, len(pool))
        if size == 0:
            return []
        try:
            reply = await self.ctx.client.preferred(size, pool, must)
            return list(reply.uuids)
        except grpc.aio.AioRpcError as exc:  # a hint only: never fail admission over it
            log.warning("no preferred allocation from the daemon", error=exc.details(), size=size)
            return [*must, *(i for i in pool if i not in must)][:size]

    async def allocate(self, ids: list[str]) -> kpb.ContainerAllocateResponse:
        if not ids:
            raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name}: no device asked for")
        refuse_duplicates(self.name, ids)
        self.ctx.refuse_unmonitored(self.name)
        view = self.ctx.view()
        cards = []
        for device_id in ids:
            card = view.card(device_id)
            if card is None or card not in self.cards(view):
                raise AllocationError(grpc.StatusCode.NOT_FOUND, f"{self.name}: no whole card {device_id!r}")
            cards.append(card)
        response = kpb.ContainerAllocateResponse(envs={"CUDA_VISIBLE_DEVICES": ",".join(c.uuid for c in cards)})
        self.ctx.answer.fill(response, [f"{self.ctx.domain}/gpu={c.uuid}" for c in cards])
        rdma_edits(cards, response)
        return response

    async def pre_start(self, ids: list[str]) -> None:
        return None


class Slices:
    """MIG slices of one profile, or TDM slices of one shape: one partition per slot, made in Allocate."""

    pre_start_required = True  # a container (re)start checks that its partition still exists

    def __init__(self, ctx: Context, *, profile: str | None = None, shape: TdmShape | None = None) -> None:
        assert (profile is None) != (shape is None)
        self.ctx = ctx
        self.profile = profile
        self.shape = shape
        suffix = f"mig-{profile}" if profile is not None else shape.suffix if shape is not None else ""
        self.name = f"{ctx.domain}/{suffix}"
        self._slot_locks = KeyedLocks()  # one Allocate per slot at a time: concurrent ones share one partition

    # ----- slots ---------------------------------------------------------------------------------------------

    def _slots_and_room(self, card: Card) -> tuple[int, int]:
        if self.profile is not None:
            profile = card.profiles.get(self.profile)
            if card.mode != partitions_pb2.PARTITION_MODE_MIG or profile is None:
                return 0, 0
            return profile.instance_count, profile.placeable
        assert self.shape is not None
        if card.mode != partitions_pb2.PARTITION_MODE_TDM:
            return 0, 0
        c, m = self.shape.compute_percent, self.shape.memory_mib
        slots = min(100 // c, card.memory_total_mib // m)
        room = min((100 - card.compute_allocated) // c, (card.memory_total_mib - card.memory_allocated_mib) // m)
        return slots, max(0, room)

    def devices(self) -> list[kpb.Device]:
        view = self.ctx.view()
        out_of_service = self.ctx.out_of_service()
        devices = []
        for card in view.cards:
            slots, room = self._slots_and_room(card)
            free_healthy = 0
            for n in range(slots):
                device_id = f"{card.uuid}{SLOT_SEP}{n}"
                used = (self.name, device_id) in view.by_device
                healthy = card.index not in out_of_service and (used or free_healthy < room)
                if healthy and not used:
                    free_healthy += 1
                devices.append(kpb.Device(ID=device_id, health=self.ctx.health(healthy), topology=_topology(card)))
        return devices

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """Pack: the free slots of the card with the least room left first, so emptier cards stay whole."""
        check_size(self.name, size)
        healthy = {d.ID for d in self.devices() if d.health == HEALTHY}
        view = self.ctx.view()
        free_per_card: dict[str, int] = {}
        available = list(dict.fromkeys(available))
        for device_id in available:
            if device_id in healthy:
                uuid = device_id.split(SLOT_SEP)[0]
                free_per_card[uuid] = free_per_card.get(uuid, 0) + 1
        ranked = sorted(
            (i for i in available if i not in must and i in healthy),
            key=lambda i: (free_per_card.get(i.split(SLOT_SEP)[0], 0), _card_index(view, i), i),
        )
        return [*dict.fromkeys(must), *ranked][:size]

    # ----- kubelet calls -------------------------------------------------------------------------------------

    async def allocate(self, ids: list[str]) -> kpb.ContainerAllocateResponse:
        if len(ids) != 1:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self.name}: one slice per container (asked for {len(ids)}); a process uses one MIG device or one "
                "MPS server",
            )
        device_id = ids[0]
        slot = parse_slot(device_id)
        if slot is None:
            raise AllocationError(grpc.StatusCode.NOT_FOUND, f"{self.name}: {device_id[:200]!r} is not a slot id")
        self.ctx.refuse_unmonitored(self.name)
        async with self._slot_locks.hold(device_id):
            view = await self._read_now()
            card = view.card(slot[0])
            if card is None or slot[1] >= self._slots_and_room(card)[0]:
                raise AllocationError(grpc.StatusCode.NOT_FOUND, f"{self.name}: no slot {device_id!r} on this node now")
            current = view.by_device.get((self.name, device_id))
            if current is not None and current.owner.WhichOneof("kind") == "lease":
                # no pod listed with this slot yet: the same Allocate again (kubelet retried, or ran it twice);
                # one partition serves the slot, and the daemon gives it to whichever pod kubelet lists
                renewed = await self._renew(device_id, current)
                if renewed is not None:
                    log.info("slot allocated again before its pod was listed; same partition", slot=device_id)
                    return self._response(card, renewed)
            elif current is not None:
                await self._delete_stale(device_id, current)
            partition = await self._create(card, device_id)
        await self.ctx.changed()
        log.info("slice allocated", resource=self.name, slot=device_id, partition=partition.id, gpu=card.index)
        return self._response(card, partition)

    async def _read_now(self) -> NodeView:
        """A fresh view within the probe timeout: a frozen daemon fails the Allocate here, in seconds."""
        try:
            return await self.ctx.read_now(self.ctx.probe_timeout)
        except grpc.aio.AioRpcError as exc:
            raise AllocationError(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.name}: xpu-healthd did not answer within {self.ctx.probe_timeout:g} s "
                f"({exc.code().name}); no slice made",
            ) from None

    async def _renew(self, device_id: str, partition: partitions_pb2.Partition) -> partitions_pb2.Partition | None:
        """The slot's lease-held partition with a full lease again (the new Allocate's pod needs the time to be
        listed); None when it is gone meanwhile, or no longer the lease's (then it is deleted as stale)."""
        try:
            return await self.ctx.client.renew_lease(partition.id, self.ctx.lease_seconds)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # given to a pod meanwhile, or its lease ran out
                await self._delete_stale(device_id, partition)
                return None
            message = f"{self.name}: renewing partition {partition.id}: {exc.details()}"
            raise AllocationError(exc.code(), message) from None

    async def _delete_stale(self, device_id: str, stale: partitions_pb2.Partition) -> None:
        # kubelet gives a slot out again only after the pod that held it is gone: its partition is stale
        log.info("slot reused; deleting the partition it held", slot=device_id, partition=stale.id)
        try:
            await self.ctx.client.delete_partition(stale.id)
        except grpc.aio.AioRpcError as exc:
            message = f"{self.name}: slot {device_id}: its old partition {stale.id}: {exc.details()}"
            raise AllocationError(exc.code(), message) from None

    async def _create(self, card: Card, device_id: str) -> partitions_pb2.Partition:
        compute, memory = self._amounts(card)
        try:
            partition = await self.ctx.client.create_for_device(
                gpu_uuid=card.uuid,
                compute_percent=compute,
                memory=memory,
                resource_name=self.name,
                device_id=device_id,
                lease_seconds=self.ctx.lease_seconds,
                within=self.ctx.allocate_deadline,
            )
        except grpc.aio.AioRpcError as exc:
            await self.ctx.changed()
            raise AllocationError(exc.code(), f"{self.name}: GPU {card.index}: {exc.details()}") from None
        if self.profile is not None and partition.mig.profile != self.profile:
            with contextlib.suppress(grpc.aio.AioRpcError):  # the lease reclaims it if this fails
                await self.ctx.client.delete_partition(partition.id)  # the card had room only for a larger profile
            await self.ctx.changed()
            raise AllocationError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.name}: GPU {card.index} has no room for a {self.profile} instance now",
            )
        return partition

    def _response(self, card: Card, partition: partitions_pb2.Partition) -> kpb.ContainerAllocateResponse:
        response = kpb.ContainerAllocateResponse(envs={**dict(partition.env), "XPU_PARTITION_ID": partition.id})
        self.ctx.answer.fill(response, [partition.cdi_device])
        rdma_edits([card], response)
        return response

    def _amounts(self, card: Card) -> tuple[int, str]:
        """What to ask the daemon for: a MIG profile's own SM share and memory (its smallest covering profile is
        that profile), or the TDM shape."""
        if self.shape is not None:
            return self.shape.compute_percent, self.shape.memory
        assert self.profile is not None
        room = card.profiles[self.profile]
        total = card.total_sm or room.sm_count
        return room.sm_count * 100 // total, f"{room.memory_mib // 128 * 128}MiB"

    async def pre_start(self, ids: list[str]) -> None:
        await self.ctx.changed()  # the view may be seconds old; a container start is rare enough to read it fresh
        view = self.ctx.view()
        missing = [i for i in ids if (self.name, i) not in view.by_device]
        if missing:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.name}: the partition for {missing[0]} no longer exists (reclaimed); delete the pod to get "
                "a new one",
            )


def _card_index(view: NodeView, device_id: str) -> int:
    card = view.card(device_id.split(SLOT_SEP)[0])
    return card.index if card is not None else 1 << 30
