"""The node as a container front end sees it, read from the daemon: cards (index, UUID, NUMA node, nearest RDMA
NICs), each card's partition mode and free room, and the partitions that serve kubelet devices. Immutable; replaced
whole on every refresh."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.ownership import kubelet_device_of
from healthd.api.v1 import partitions_pb2, topology_pb2

log = structlog.get_logger("container.core.inventory")

MIB = 2**20
CDI_KIND = "xpu-runtime-kit.io/gpu"  # the daemon's CDI spec (healthd/partition/cdi.py, cdi_cards.py)


def card_cdi_device(uuid: str) -> str:
    """The fully qualified CDI name of a whole card in the daemon's spec: named by its UUID."""
    return f"{CDI_KIND}={uuid}"


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    netdevs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProfileRoom:
    name: str
    memory_mib: int
    sm_count: int
    instance_count: int
    placeable: int


@dataclass(frozen=True, slots=True)
class Card:
    index: int
    uuid: str
    numa_node: int | None
    mode: int  # partitions_pb2.PartitionMode
    hardware_mig: bool
    memory_total_mib: int
    compute_allocated: int
    memory_allocated_mib: int
    profiles: Mapping[str, ProfileRoom] = field(default_factory=dict)
    nics: tuple[Nic, ...] = ()  # the RDMA NICs nearest to this card (ties included)

    @property
    def total_sm(self) -> int:
        return max((p.sm_count for p in self.profiles.values()), default=0)


@dataclass(frozen=True, slots=True)
class NodeView:
    cards: tuple[Card, ...] = ()
    # (resource name, device id) -> the ready partition that serves that kubelet device
    by_device: Mapping[tuple[str, str], partitions_pb2.Partition] = field(default_factory=dict)
    # the daemon's replies as read, for a front end that publishes them in its own terms (the DRA driver's slices)
    capacity: tuple[partitions_pb2.CardCapacity, ...] = ()
    partitions: tuple[partitions_pb2.Partition, ...] = ()
    topology: topology_pb2.GetTopologyResponse | None = None

    def card(self, uuid: str) -> Card | None:
        return next((c for c in self.cards if c.uuid == uuid), None)


def nearest_nics(topology: topology_pb2.GetTopologyResponse) -> dict[int, tuple[Nic, ...]]:
    """Per GPU index: the NICs at the smallest link distance from it."""
    nics = {n.name: Nic(n.name, tuple(n.netdevs)) for n in topology.nics}
    best: dict[int, tuple[int, list[Nic]]] = {}
    for link in topology.nic_links:
        if not link.a.startswith("GPU") or link.b not in nics:
            continue
        gpu = int(link.a[3:])
        distance, chosen = best.get(gpu, (link.distance + 1, []))
        if link.distance < distance:
            best[gpu] = (link.distance, [nics[link.b]])
        elif link.distance == distance:
            chosen.append(nics[link.b])
    return {gpu: tuple(sorted(chosen, key=lambda n: n.name)) for gpu, (_, chosen) in best.items()}


def build_view(
    capacity: list[partitions_pb2.CardCapacity],
    partitions: list[partitions_pb2.Partition],
    topology: topology_pb2.GetTopologyResponse | None,
) -> NodeView:
    numa: dict[int, int | None] = {}
    nics: dict[int, tuple[Nic, ...]] = {}
    if topology is not None:
        for g in topology.gpus:
            numa[g.index] = g.location.numa_node if g.location.HasField("numa_node") else None
        nics = nearest_nics(topology)
    cards = tuple(
        Card(
            index=c.gpu,
            uuid=c.gpu_uuid,
            numa_node=numa.get(c.gpu),
            mode=c.mode,
            hardware_mig=c.hardware_mig_enabled,
            memory_total_mib=c.memory_total_bytes // MIB,
            compute_allocated=c.compute_percent_allocated,
            memory_allocated_mib=c.memory_allocated_bytes // MIB,
            profiles={
                p.profile: ProfileRoom(p.profile, p.memory_bytes // MIB, p.sm_count, p.instance_count, p.placeable)
                for p in c.mig_profiles
            },
            nics=nics.get(c.gpu, ()),
        )
        for c in sorted(capacity, key=lambda c: c.gpu)
    )
    by_device: dict[tuple[str, str], partitions_pb2.Partition] = {}
    for p in partitions:
        key = kubelet_device_of(p)
        if key is not None and p.state == "ready":
            by_device[key] = p
    return NodeView(
        cards=cards,
        by_device=by_device,
        capacity=tuple(sorted(capacity, key=lambda c: c.gpu)),
        partitions=tuple(partitions),
        topology=topology,
    )


class Inventory:
    """The last view read from the daemon. A daemon whose partition service is not serving every card yet (one card
    hung at start-up) still gives the cards that answer on their own: each joins when it answers."""

    def __init__(self, client: DaemonClient) -> None:
        self._client = client
        self.view = NodeView()
        self.loaded = False
        self.unanswered: tuple[str, ...] = ()  # cards left out of the view because they did not answer

    async def refresh(self, *, within: float | None = None) -> bool:
        """Read capacity, partitions and topology; True when the view changed. Raises grpc errors when the daemon
        cannot be reached (the previous view stays)."""
        topology: topology_pb2.GetTopologyResponse | None = None
        try:
            capacity = await self._client.capacity(within=within)
            unanswered: tuple[str, ...] = ()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            topology = await self._topology(within)
            capacity, unanswered = await self._card_by_card(topology, exc, within)
        partitions = await self._client.partitions(within=within)
        if topology is None:
            topology = await self._topology(within)
        view = build_view(capacity, partitions, topology)
        if unanswered != self.unanswered:
            if unanswered:
                log.warning("serving the cards that answer; these join when they do", waiting_for=list(unanswered))
            else:
                log.info("every card answers")
        self.unanswered = unanswered
        changed = view != self.view
        self.view = view
        self.loaded = True
        return changed

    async def _topology(self, within: float | None) -> topology_pb2.GetTopologyResponse | None:
        try:
            return await self._client.topology(within=within)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None  # not collected yet: no NUMA or NIC hints this time

    async def _card_by_card(
        self, topology: topology_pb2.GetTopologyResponse | None, first: grpc.aio.AioRpcError, within: float | None
    ) -> tuple[list[partitions_pb2.CardCapacity], tuple[str, ...]]:
        """The node-wide capacity call is unavailable: ask each known card alone (from the topology, else the
        last view). Raises ``first`` when no card answers."""
        uuids = [g.uuid for g in topology.gpus] if topology is not None else []
        uuids = uuids or [c.uuid for c in self.view.cards]
        capacity: list[partitions_pb2.CardCapacity] = []
        unanswered: list[str] = []
        for uuid in uuids:
            try:
                capacity += await self._client.capacity(uuid, within=within)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                unanswered.append(uuid)
        if not capacity:
            raise first
        return capacity, tuple(unanswered)
