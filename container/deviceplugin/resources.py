"""The resources the plugin offers and what each kubelet call does with them.

- ``<domain>/gpu``: whole cards (device id = GPU UUID) of partition mode none with MIG off in hardware.
- ``<domain>/mig-<profile>``: MIG slices of cards in partition mode mig; ``<domain>/tdm-<N>c.<M>``: TDM slices of a
  configured size on cards in partition mode tdm. Each card has one slot per instance it could hold (device id
  ``<GPU UUID>::<n>``); a free slot is Healthy only while the card still has room for one more, so kubelet's count
  follows what can really be created. Allocate creates the partition under a short lease that names the slot;
  the daemon gives it to the pod once kubelet lists the slot (see healthd/partition/podbind.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.inventory import Card, NodeView
from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.config import TdmShape
from healthd.api.v1 import partitions_pb2

log = structlog.get_logger("container.deviceplugin.resources")

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SLOT_SEP = "::"
NICS_ANNOTATION = "xpu-runtime-kit.io/rdma-nics"


class AllocationError(Exception):
    """Answered to kubelet with ``code``; kubelet fails the pod's admission with the message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
            kpb.Device(ID=c.uuid, health=UNHEALTHY if c.index in out_of_service else HEALTHY, topology=_topology(c))
            for c in self.cards(self.ctx.view())
        ]

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The daemon's best-connected set among the available healthy cards (it also leaves out faulty ones)."""
        healthy = {d.ID for d in self.devices() if d.health == HEALTHY}
        pool = [i for i in available if i in healthy or i in must]
        try:
            reply = await self.ctx.client.preferred(size, pool, must)
            return list(reply.uuids)
        except grpc.aio.AioRpcError as exc:  # a hint only: never fail admission over it
            log.warning("no preferred allocation from the daemon", error=exc.details(), size=size)
            return [*must, *(i for i in pool if i not in must)][:size]

    async def allocate(self, ids: list[str]) -> kpb.ContainerAllocateResponse:
        view = self.ctx.view()
        cards = []
        for device_id in ids:
            card = view.card(device_id)
            if card is None or card not in self.cards(view):
                raise AllocationError(grpc.StatusCode.NOT_FOUND, f"{self.name}: no whole card {device_id!r}")
            cards.append(card)
        uuids = ",".join(c.uuid for c in cards)
        response = kpb.ContainerAllocateResponse(
            envs={"CUDA_VISIBLE_DEVICES": uuids, "NVIDIA_VISIBLE_DEVICES": uuids},
            cdi_devices=[kpb.CDIDevice(name=f"{self.ctx.domain}/gpu={c.uuid}") for c in cards],
        )
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
                devices.append(
                    kpb.Device(ID=device_id, health=HEALTHY if healthy else UNHEALTHY, topology=_topology(card))
                )
        return devices

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """Pack: the free slots of the card with the least room left first, so emptier cards stay whole."""
        healthy = {d.ID for d in self.devices() if d.health == HEALTHY}
        view = self.ctx.view()
        free_per_card: dict[str, int] = {}
        for device_id in available:
            if device_id in healthy:
                uuid = device_id.split(SLOT_SEP)[0]
                free_per_card[uuid] = free_per_card.get(uuid, 0) + 1
        ranked = sorted(
            (i for i in available if i not in must and i in healthy),
            key=lambda i: (free_per_card.get(i.split(SLOT_SEP)[0], 0), _card_index(view, i), i),
        )
        return [*must, *ranked][:size]

    # ----- kubelet calls -------------------------------------------------------------------------------------

    async def allocate(self, ids: list[str]) -> kpb.ContainerAllocateResponse:
        if len(ids) != 1:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self.name}: one slice per container (asked for {len(ids)}); a process uses one MIG device or one "
                "MPS server",
            )
        device_id = ids[0]
        view = self.ctx.view()
        uuid, _, n = device_id.partition(SLOT_SEP)
        card = view.card(uuid)
        if card is None or not n.isdigit() or int(n) >= self._slots_and_room(card)[0]:
            raise AllocationError(grpc.StatusCode.NOT_FOUND, f"{self.name}: no slot {device_id!r} on this node now")
        stale = view.by_device.get((self.name, device_id))
        if stale is not None:
            # kubelet gives a slot out again only after the pod that held it is gone: that partition is stale
            log.info("slot reused; deleting the partition it held", slot=device_id, partition=stale.id)
            try:
                await self.ctx.client.delete_partition(stale.id)
            except grpc.aio.AioRpcError as exc:
                message = f"{self.name}: slot {device_id}: its old partition {stale.id}: {exc.details()}"
                raise AllocationError(exc.code(), message) from None
        compute, memory = self._amounts(card)
        try:
            partition = await self.ctx.client.create_for_device(
                gpu_uuid=card.uuid,
                compute_percent=compute,
                memory=memory,
                resource_name=self.name,
                device_id=device_id,
                lease_seconds=self.ctx.lease_seconds,
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
        await self.ctx.changed()
        log.info("slice allocated", resource=self.name, slot=device_id, partition=partition.id, gpu=card.index)
        response = kpb.ContainerAllocateResponse(
            envs={**dict(partition.env), "XPU_PARTITION_ID": partition.id},
            cdi_devices=[kpb.CDIDevice(name=partition.cdi_device)],
        )
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
