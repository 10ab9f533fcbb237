"""gRPC Partitions service over the manager.

Access: grpcio does not expose a unix-socket peer's credentials (SO_PEERCRED) to Python servicers, so access is
decided by which socket a call arrives on. The admin socket (0600, or 0660 with an admin group) serves every call;
the monitoring socket (0660) serves reads and answers writes with PERMISSION_DENIED. The kernel checks the socket
file's mode and group on connect, which is what makes this hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
import structlog

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.partition import requests as req
from healthd.partition.errors import PartitionError
from healthd.partition.manager import CardCapacity, CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind, PartitionRecord
from healthd.partition.quantity import MIB
from healthd.partition.sharing import SharingPolicy
from healthd.rpc.errors import failure, from_invalid_field, unavailable
from healthd.rpc.validation import InvalidField

log = structlog.get_logger("partition.service")

MODES = {
    pb.PARTITION_MODE_NONE: CardMode.NONE,
    pb.PARTITION_MODE_TDM: CardMode.TDM,
    pb.PARTITION_MODE_MIG: CardMode.MIG,
}
MODE_TO_PB = {v: k for k, v in MODES.items()}
SHARING = {
    pb.TDM_SHARING_DEFAULT: None,
    pb.TDM_SHARING_ISOLATED: SharingPolicy.ISOLATED,
    pb.TDM_SHARING_SHARED: SharingPolicy.SHARED,
}


def owner_to_pb(owner: Owner) -> pb.Owner:
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


def _kubelet_device_pb(owner: Owner) -> pb.KubeletDevice | None:
    return pb.KubeletDevice(resource_name=owner.resource_name, device_id=owner.device_id) if owner.device_id else None


def partition_to_pb(manager: PartitionManager, r: PartitionRecord) -> pb.Partition:
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
    if r.client_uid is not None:
        msg.client_uid = r.client_uid
    if edits is not None:
        msg.env.update(edits.env)
        msg.mounts.extend(
            pb.Mount(host_path=m.host_path, container_path=m.container_path, options=list(m.options))
            for m in edits.mounts
        )
        msg.device_nodes.extend(
            pb.DeviceNode(path=n.path, host_path=n.path, permissions="rw") for n in edits.device_nodes
        )
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


def capacity_to_pb(c: CardCapacity) -> pb.CardCapacity:
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
        tdm_sharing=c.sharing,
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
    """One instance per socket: ``writable`` only on the admin socket.

    Handlers raise RpcFailure (the server's guard turns it into the status with details); every request field is
    checked in healthd/partition/requests.py before the manager sees it.
    """

    def __init__(self, manager: PartitionManager, *, writable: bool) -> None:
        self._m = manager
        self._writable = writable

    def _require_ready(self) -> None:
        if not self._m.ready:
            raise unavailable(
                "PARTITIONS_STARTING",
                "partitions are not serving yet: the GPUs have not answered since the daemon started; try again",
            )

    def _require_write(self, what: str) -> None:
        if not self._writable:
            raise failure(
                grpc.StatusCode.PERMISSION_DENIED,
                "READ_ONLY_SOCKET",
                f"{what} changes partitions: use the admin socket (this socket serves reads only)",
            )

    async def SetCardMode(  # noqa: N802
        self, request: pb.SetCardModeRequest, context: grpc.aio.ServicerContext[pb.SetCardModeRequest, pb.CardCapacity]
    ) -> pb.CardCapacity:
        self._require_write("SetCardMode")
        with _checked():
            gpu = req.gpu_ref(request.gpu)
            mode = MODES.get(request.mode)
            if mode is None:
                raise InvalidField("mode", f"must be NONE, TDM or MIG, got {request.mode}")
            if request.sharing not in SHARING:
                raise InvalidField("sharing", f"must be DEFAULT, ISOLATED or SHARED, got {request.sharing}")
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("gpu", str(gpu))):
            return capacity_to_pb(await self._m.set_mode(str(gpu), mode, SHARING[request.sharing]))

    async def CreatePartition(  # noqa: N802
        self,
        request: pb.CreatePartitionRequest,
        context: grpc.aio.ServicerContext[pb.CreatePartitionRequest, pb.Partition],
    ) -> pb.Partition:
        self._require_write("CreatePartition")
        with _checked():
            owner, ttl = req.owner_from_pb(request.owner)
            create = CreateRequest(
                owner=owner,
                gpu=str(req.gpu_ref(request.gpu, allow_any=True)),
                compute_percent=req.compute_percent(request.compute_percent),
                memory_mib=req.memory_mib(request.memory),
                request_id=req.request_id(request.request_id),
                lease_ttl_seconds=ttl,
                allow_faulty_gpus=request.allow_faulty_gpus,
                client_uid=req.client_uid(request),
            )
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("gpu", create.gpu)):
            record = await self._m.create(create)
        return partition_to_pb(self._m, record)

    async def GetPartition(  # noqa: N802
        self, request: pb.GetPartitionRequest, context: grpc.aio.ServicerContext[pb.GetPartitionRequest, pb.Partition]
    ) -> pb.Partition:
        with _checked():
            pid = req.partition_id(request.id)
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("partition", pid)):
            return partition_to_pb(self._m, self._m.get(pid))

    async def ListPartitions(  # noqa: N802
        self,
        request: pb.ListPartitionsRequest,
        context: grpc.aio.ServicerContext[pb.ListPartitionsRequest, pb.ListPartitionsResponse],
    ) -> pb.ListPartitionsResponse:
        with _checked():
            gpu = req.gpu_ref(request.gpu, optional=True)
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("gpu", str(gpu or ""))):
            records = self._m.list_partitions(str(gpu or ""))
        return pb.ListPartitionsResponse(partitions=[partition_to_pb(self._m, r) for r in records])

    async def DeletePartition(  # noqa: N802
        self,
        request: pb.DeletePartitionRequest,
        context: grpc.aio.ServicerContext[pb.DeletePartitionRequest, pb.DeletePartitionResponse],
    ) -> pb.DeletePartitionResponse:
        self._require_write("DeletePartition")
        with _checked():
            pid = req.partition_id(request.id)
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("partition", pid)):
            deleted = await self._m.delete(pid)
        return pb.DeletePartitionResponse(id=pid, deleted=deleted)

    async def RenewLease(  # noqa: N802
        self, request: pb.RenewLeaseRequest, context: grpc.aio.ServicerContext[pb.RenewLeaseRequest, pb.Partition]
    ) -> pb.Partition:
        self._require_write("RenewLease")
        with _checked():
            pid = req.partition_id(request.id)
            ttl = req.ttl_seconds(request.ttl_seconds)
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("partition", pid)):
            record = await self._m.renew_lease(pid, ttl)
        return partition_to_pb(self._m, record)

    async def GetCapacity(  # noqa: N802
        self,
        request: pb.GetCapacityRequest,
        context: grpc.aio.ServicerContext[pb.GetCapacityRequest, pb.GetCapacityResponse],
    ) -> pb.GetCapacityResponse:
        with _checked():
            gpu = req.gpu_ref(request.gpu, optional=True)
        self._require_ready()  # after the request checks: a malformed request is wrong whenever it comes
        with _manager_errors(("gpu", str(gpu or ""))):
            cards = self._m.capacity(str(gpu or ""))
        return pb.GetCapacityResponse(cards=[capacity_to_pb(c) for c in cards])


@contextlib.contextmanager
def _checked() -> Iterator[None]:
    """Field checks: InvalidField -> INVALID_ARGUMENT with a BadRequest field violation."""
    try:
        yield
    except InvalidField as exc:
        raise from_invalid_field(exc) from None


@contextlib.contextmanager
def _manager_errors(resource: tuple[str, str]) -> Iterator[None]:
    """Manager errors -> their status; NOT_FOUND names ``resource`` (type, name) in a ResourceInfo."""
    try:
        yield
    except PartitionError as exc:
        raise req.to_failure(exc, resource) from None
