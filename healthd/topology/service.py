"""gRPC Topology service over the cached topology, and the conversions between the model and its messages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

import grpc

from exporter.topology.allocation import AllocationError, preferred_allocation
from exporter.topology.model import Gpu, Link, LinkKind, Nic, PcieLocation, Topology
from exporter.topology.refresher import RefreshStatus
from healthd.api.v1 import topology_pb2 as pb
from healthd.api.v1 import topology_pb2_grpc as pb_grpc
from healthd.rpc.errors import (
    failed_precondition,
    failure,
    from_invalid_field,
    invalid_argument,
    not_found,
    unavailable,
)
from healthd.rpc.validation import GpuRef, InvalidField, parse_gpu_ref, quote

_KIND_TO_PB = {kind: getattr(pb, f"LINK_KIND_{kind.name}") for kind in LinkKind}
_PB_TO_KIND = {v: k for k, v in _KIND_TO_PB.items()}
MAX_IDS = 1024


def _location_pb(loc: PcieLocation) -> pb.PcieLocation:
    msg = pb.PcieLocation(
        pci_bus_id=loc.bdf,
        host_bridge=loc.host_bridge,
        bridges=list(loc.bridges),
        pcie_switch=loc.pcie_switch,
        cpu_affinity=loc.local_cpus,
    )
    if loc.numa_node is not None:
        msg.numa_node = loc.numa_node
    if loc.socket is not None:
        msg.socket = loc.socket
    return msg


def _link_pb(a: str, b: str, link: Link) -> pb.TopologyLink:
    return pb.TopologyLink(
        a=a, b=b, kind=_KIND_TO_PB[link.kind], nvlinks=link.nvlinks, label=link.label, distance=link.cost
    )


def topology_to_pb(t: Topology) -> pb.GetTopologyResponse:
    return pb.GetTopologyResponse(
        gpus=[
            pb.TopologyGpu(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                location=_location_pb(g.location),
                nvlink_peers=list(g.nvlink_peers or ()),
                nvlink_known=g.nvlink_peers is not None,
                serial=g.serial,
            )
            for g in t.gpus
        ],
        nics=[
            pb.TopologyNic(
                name=n.name,
                netdevs=list(n.netdevs),
                location=_location_pb(n.location),
                model=n.model,
                link_layer=n.link_layer,
                state=n.state,
            )
            for n in t.nics
        ],
        gpu_links=[_link_pb(f"GPU{a}", f"GPU{b}", link) for (a, b), link in sorted(t.gpu_links.items())],
        nic_links=[_link_pb(f"GPU{g}", nic, link) for (g, nic), link in sorted(t.nic_links.items())],
        numa_nodes=list(t.numa_nodes),
        sockets=list(t.sockets),
        collected_at=t.collected_at,
        source=t.source,
        warnings=list(t.warnings),
    )


def _location_from_pb(msg: pb.PcieLocation) -> PcieLocation:
    return PcieLocation(
        bdf=msg.pci_bus_id,
        host_bridge=msg.host_bridge,
        bridges=tuple(msg.bridges),
        numa_node=msg.numa_node if msg.HasField("numa_node") else None,
        socket=msg.socket if msg.HasField("socket") else None,
        local_cpus=msg.cpu_affinity,
    )


def topology_from_pb(msg: pb.GetTopologyResponse) -> Topology:
    """Rebuild the model on the client side (xpuctl renders it with the same code the daemon tests use)."""
    from exporter.topology.model import pcie_kind

    gpus = tuple(
        Gpu(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            location=_location_from_pb(g.location),
            nvlink_peers=tuple(g.nvlink_peers) if g.nvlink_known else None,
            serial=g.serial,
        )
        for g in msg.gpus
    )
    nics = tuple(
        Nic(n.name, tuple(n.netdevs), _location_from_pb(n.location), n.model, n.link_layer, n.state) for n in msg.nics
    )

    def link(m: pb.TopologyLink) -> Link:
        return Link(_PB_TO_KIND.get(m.kind, LinkKind.SYS), m.nvlinks)

    gpu_links = {(int(m.a[3:]), int(m.b[3:])): link(m) for m in msg.gpu_links}
    nic_links = {(int(m.a[3:]), m.b): link(m) for m in msg.nic_links}
    pcie_links = {(a.index, b.index): Link(pcie_kind(a.location, b.location)) for a in gpus for b in gpus}
    return Topology(
        gpus=gpus,
        nics=nics,
        gpu_links=gpu_links,
        nic_links=nic_links,
        pcie_links=pcie_links,
        numa_nodes=tuple(msg.numa_nodes),
        sockets=tuple(msg.sockets),
        source=msg.source,
        collected_at=msg.collected_at,
        warnings=tuple(msg.warnings),
    )


class TopologyService(pb_grpc.TopologyServicer):
    def __init__(
        self,
        latest: Callable[[], Topology | None],
        status: Callable[[], RefreshStatus],
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,
    ) -> None:
        self._latest = latest
        self._status = status
        self._out_of_service = out_of_service  # card indices with faults that keep new work off them

    def _topology(self) -> Topology:
        topology = self._latest()
        if topology is None:
            why = self._status().last_error or "first collection under way"
            raise unavailable("TOPOLOGY_NOT_COLLECTED", f"topology not collected yet: {quote(why, 300)}")
        return topology

    async def Get(  # noqa: N802
        self,
        request: pb.GetTopologyRequest,
        context: grpc.aio.ServicerContext[pb.GetTopologyRequest, pb.GetTopologyResponse],
    ) -> pb.GetTopologyResponse:
        return topology_to_pb(self._topology())

    async def PreferredAllocation(  # noqa: N802
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        for field in ("available", "must_include"):
            if len(getattr(request, field)) > MAX_IDS:
                raise invalid_argument(field, f"at most {MAX_IDS} device ids")
        if request.count == 0:
            raise invalid_argument("count", "must be at least 1")
        try:  # a malformed id is INVALID_ARGUMENT whether or not the topology is known yet
            available_refs = [parse_gpu_ref(raw, "available") for raw in request.available]
            must_refs = [parse_gpu_ref(raw, "must_include") for raw in request.must_include]
        except InvalidField as exc:
            raise from_invalid_field(exc) from None
        topology = self._topology()
        try:
            available = resolve_ids(topology, available_refs, "available")
            must = resolve_ids(topology, must_refs, "must_include")
        except LookupError as exc:
            field, name, message = exc.args
            raise not_found("gpu", name, message, field=field) from None
        excluded: list[int] = []
        if not request.include_faulty_gpus:
            faulty = self._out_of_service()
            pool = available or [g.index for g in topology.gpus]
            excluded = sorted({g for g in pool if g in faulty})
            held = sorted({g for g in must if g in faulty})
            if held:
                raise failed_precondition(
                    "GPU_OUT_OF_SERVICE",
                    f"must_include: GPU {held[0]} has an active fault or a hung driver call that takes it out of "
                    "service (set include_faulty_gpus to use it anyway)",
                    gpu=str(held[0]),
                )
            if excluded:
                available = [g for g in pool if g not in faulty]
                if len(available) < request.count:
                    raise failure(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "NOT_ENOUGH_GPUS",
                        f"asked for {request.count} GPUs, {len(available)} available without faults "
                        f"(left out for faults: {', '.join(map(str, excluded))})",
                    )
        try:
            # exact search can take ~0.1 s for 16 cards: keep it off the event loop
            alloc = await asyncio.to_thread(preferred_allocation, topology, request.count, available, must)
        except AllocationError as exc:
            if exc.reason == "exhausted":
                raise failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "NOT_ENOUGH_GPUS", str(exc)) from None
            field = "must_include" if str(exc).startswith("must_include") else "count"
            raise invalid_argument(field, str(exc)) from None
        return pb.PreferredAllocationResponse(
            gpus=list(alloc.gpus),
            uuids=list(alloc.uuids),
            nics=[
                pb.NicChoice(name=n.name, netdevs=list(n.netdevs), gpu=n.gpu, link=n.link.label, level=n.level)
                for n in alloc.nics
            ],
            worst_link=alloc.worst_link.label,
            total_distance=alloc.total_cost,
            exact=alloc.exact,
            excluded_faulty_gpus=excluded,
        )


def resolve_ids(topology: Topology, refs: Sequence[GpuRef], field: str) -> list[int]:
    """Parsed GPU references (parse_gpu_ref: only ASCII digits make an index) -> indices on this node;
    LookupError(field, id, message) for unknown ones."""
    by_uuid = {g.uuid.lower(): g.index for g in topology.gpus}
    indices = {g.index for g in topology.gpus}
    out: list[int] = []
    for ref in refs:
        if ref.index is not None:
            if ref.index not in indices:
                raise LookupError(
                    field, str(ref.index), f"{field}: no GPU {ref.index} on this node ({len(indices)} GPUs)"
                )
            out.append(ref.index)
        elif ref.uuid.lower() in by_uuid:
            out.append(by_uuid[ref.uuid.lower()])
        else:
            raise LookupError(field, ref.uuid, f"{field}: no GPU with UUID {quote(ref.uuid)} on this node")
    return out
