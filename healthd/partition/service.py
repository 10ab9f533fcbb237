"""gRPC Partitions service over the manager.

Access: grpcio does not expose a unix-socket peer's credentials (SO_PEERCRED) to Python servicers, so access is
decided by which socket a call arrives on. The admin socket (0600, or 0660 with an admin group) serves every call;
the monitoring socket (0660) serves reads and answers writes with PERMISSION_DENIED. The kernel checks the socket
file's mode and group on connect, which is what makes this hold.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
import structlog

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CardCapacity, CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind, PartitionRecord
from healthd.partition.quantity import MIB, check_compute_percent, parse_memory_mib

log = structlog.get_logger("partition.service")

STATUS = {
    Kind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Kind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Kind.PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Kind.EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Kind.PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
}

MODES = {
    pb.PARTITION_MODE_NONE: CardMode.NONE,
    pb.PARTITION_MODE_TDM: CardMode.TDM,
    pb.PARTITION_MODE_MIG: CardMode.MIG,
}
MODE_TO_PB = {v: k for k, v in MODES.items()}


def owner_from_pb(owner: Any) -> tuple[Owner, float]:
    """(Owner, lease ttl seconds)."""
    which = owner.WhichOneof("kind")
    if which == "container":
        return Owner(OwnerKind.CONTAINER, container_id=owner.container.id, cgroup_path=owner.container.cgroup_path), 0
    if which == "pod":
        p = owner.pod
        device = p.kubelet_device
        return Owner(
            OwnerKind.POD,
            namespace=p.namespace,
            pod=p.name,
            container=p.container,
            resource_name=device.resource_name,
            device_id=device.device_id,
        ), 0
    if which == "process":
        return Owner(OwnerKind.PROCESS, pid=owner.process.pid), 0
    if which == "lease":
        ttl = owner.lease.ttl_seconds
        if ttl != ttl:  # NaN
            raise PartitionError(Kind.INVALID, "owner.lease.ttl_seconds: not a number")
        device = owner.lease.kubelet_device
        return Owner(
            OwnerKind.LEASE, holder=owner.lease.holder, resource_name=device.resource_name, device_id=device.device_id
        ), ttl
    raise PartitionError(Kind.INVALID, "owner: required (container, pod, process or lease)")


def owner_to_pb(owner: Owner) -> Any:
    match owner.kind:
        case OwnerKind.CONTAINER:
            return pb.Owner(container=pb.ContainerOwner(id=owner.container_id, cgroup_path=owner.cgroup_path))
        case OwnerKind.POD:
            return pb.Owner(
                pod=pb.PodOwner(
                    namespace=owner.namespace,
                    name=owner.pod,
                    container=owner.container,
                    kubelet_device=_kubelet_device_pb(owner),
                )
            )
        case OwnerKind.PROCESS:
            return pb.Owner(process=pb.ProcessOwner(pid=owner.pid))
        case OwnerKind.LEASE:
            return pb.Owner(lease=pb.LeaseOwner(holder=owner.holder, kubelet_device=_kubelet_device_pb(owner)))


def _kubelet_device_pb(owner: Owner) -> Any:
    return pb.KubeletDevice(resource_name=owner.resource_name, device_id=owner.device_id) if owner.device_id else None


def partition_to_pb(manager: PartitionManager, r: PartitionRecord) -> Any:
    edits = manager.edits(r) if r.state.value == "ready" else None
    msg = pb.Partition(
        id=r.id,
        gpu=r.gpu,
        gpu_uuid=r.gpu_uuid,
        mode=MODE_TO_PB[r.mode],
        compute_percent=r.compute_percent,
        memory_limit_bytes=r.memory_mib * MIB,
        owner=owner_to_pb(r.owner),
        state=r.state.value,
        created_at=r.created_at,
        lease_expires_at=r.lease_expires_at,
        request_id=r.request_id,
        cdi_device=manager.cdi_name(r),
    )
    if edits is not None:
        msg.env.update(edits.env)
        msg.mounts.extend(
            pb.Mount(host_path=m.host_path, container_path=m.container_path, options=list(m.options))
            for m in edits.mounts
        )
        msg.device_nodes.extend(pb.DeviceNode(path=p, host_path=p, permissions="rw") for p in edits.device_nodes)
    if r.mig is not None:
        msg.mig.CopyFrom(
            pb.MigDevice(
                profile=r.mig.profile_name,
                profile_id=r.mig.profile_id,
                gpu_instance_id=r.mig.gpu_instance_id,
                compute_instance_id=r.mig.compute_instance_id,
                placement_start=r.mig.placement_start,
                placement_size=r.mig.placement_size,
                uuid=r.mig.uuid,
            )
        )
    return msg


def capacity_to_pb(c: CardCapacity) -> Any:
    return pb.CardCapacity(
        gpu=c.gpu,
        gpu_uuid=c.gpu_uuid,
        mode=MODE_TO_PB[c.mode],
        partitions=c.partitions,
        compute_percent_allocated=c.compute_percent_allocated,
        memory_allocated_bytes=c.memory_allocated_mib * MIB,
        memory_total_bytes=c.memory_total_mib * MIB,
        mig_memory_slices_free=c.mig_memory_slices_free,
        foreign_mig_instances=[
            pb.ForeignMigInstance(
                gpu_instance_id=i.gpu_instance_id,
                profile=i.profile_name,
                placement_start=i.placement_start,
                placement_size=i.placement_size,
                uuid=i.uuid,
            )
            for i in c.foreign
        ],
        hardware_mig_enabled=c.hardware_mig,
        mig_profiles=[
            pb.MigProfileRoom(
                profile=p.name,
                profile_id=p.profile_id,
                memory_bytes=p.memory_mib * MIB,
                sm_count=p.sm_count,
                instance_count=p.instance_count,
                placeable=placeable,
            )
            for p, placeable in c.mig_room
        ],
    )


class PartitionsService(pb_grpc.PartitionsServicer):
    """One instance per socket: ``writable`` only on the admin socket."""

    def __init__(self, manager: PartitionManager, *, writable: bool) -> None:
        self._m = manager
        self._writable = writable

    async def _fail(self, context: grpc.aio.ServicerContext, exc: PartitionError) -> NoReturn:
        await context.abort(STATUS[exc.kind], exc.message)
        raise AssertionError("abort returned")  # pragma: no cover

    async def _require_write(self, context: grpc.aio.ServicerContext, what: str) -> None:
        if not self._writable:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} changes partitions: use the admin socket (this socket serves reads only)",
            )

    async def _guard(self, context: grpc.aio.ServicerContext, coro: Any) -> Any:
        try:
            return await coro
        except PartitionError as exc:
            await self._fail(context, exc)

    async def SetCardMode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._require_write(context, "SetCardMode")
        mode = MODES.get(request.mode)
        if mode is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode: must be NONE, TDM or MIG")
        assert mode is not None
        cap = await self._guard(context, self._m.set_mode(request.gpu, mode))
        return capacity_to_pb(cap)

    async def CreatePartition(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._require_write(context, "CreatePartition")

        async def create() -> PartitionRecord:
            owner, ttl = owner_from_pb(request.owner)
            return await self._m.create(
                CreateRequest(
                    owner=owner,
                    gpu=request.gpu,
                    compute_percent=check_compute_percent(request.compute_percent),
                    memory_mib=parse_memory_mib(request.memory),
                    request_id=request.request_id,
                    lease_ttl_seconds=ttl,
                    allow_faulty_gpus=request.allow_faulty_gpus,
                )
            )

        record = await self._guard(context, create())
        return partition_to_pb(self._m, record)

    async def GetPartition(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            return partition_to_pb(self._m, self._m.get(request.id))
        except PartitionError as exc:
            await self._fail(context, exc)

    async def ListPartitions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            records = self._m.list_partitions(request.gpu)
        except PartitionError as exc:
            await self._fail(context, exc)
        return pb.ListPartitionsResponse(partitions=[partition_to_pb(self._m, r) for r in records])

    async def DeletePartition(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._require_write(context, "DeletePartition")
        if not request.id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "id: required")
        deleted = await self._guard(context, self._m.delete(request.id))
        return pb.DeletePartitionResponse(id=request.id, deleted=deleted)

    async def RenewLease(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._require_write(context, "RenewLease")
        if request.ttl_seconds != request.ttl_seconds:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ttl_seconds: not a number")
        record = await self._guard(context, self._m.renew_lease(request.id, request.ttl_seconds))
        return partition_to_pb(self._m, record)

    async def GetCapacity(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            cards = self._m.capacity(request.gpu)
        except PartitionError as exc:
            await self._fail(context, exc)
        return pb.GetCapacityResponse(cards=[capacity_to_pb(c) for c in cards])
