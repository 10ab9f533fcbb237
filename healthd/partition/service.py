"""gRPC Partitions service over the manager.

Access: grpcio does not expose a unix-socket peer's credentials (SO_PEERCRED) to Python servicers, so access is
decided by which socket a call arrives on. The admin socket (0600, or 0660 with an admin group) serves every call;
the monitoring socket (0660) serves reads and answers writes with PERMISSION_DENIED. The kernel checks the socket
file's mode and group on connect, which is what makes this hold.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from exporter.backends.types import MigProfile
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
        case OwnerKind.CLAIM:
            return pb.Owner(claim=pb.ClaimOwner(namespace=owner.namespace, name=owner.claim, uid=owner.claim_uid))


def _kubelet_device_pb(owner: Owner) -> pb.KubeletDevice | None:
    return pb.KubeletDevice(resource_name=owner.resource_name, device_id=owner.device_id) if owner.device_id else None


def partition_to_pb(manager: PartitionManager, r: PartitionRecord) -> pb.Partition:
    edits = manager.edits(r) if r.state.value == "ready" and manager.card_known(r.gpu) else None
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
        mig_memory_slices=c.mig_memory_slices,
        driver_version=c.driver_version,
        architecture=c.architecture,
        cuda_compute_capability="{}.{}".format(*c.compute_capability) if c.compute_capability else "",
        mig_profiles=[
            pb.MigProfileRoom(
                profile=p.name,
                profile_id=p.profile_id,
                memory_bytes=p.memory_mib * MIB,
                sm_count=p.sm_count,
                instance_count=p.instance_count,
                placeable=placeable,
                placements=[pb.MigPlacementRange(start=s, size=n) for s, n in p.placements],
                media=_media(p),
            )
            for p, placeable in c.mig_room
        ],
    )


def _media(p: MigProfile) -> pb.MediaEngines | None:
    m = p.media
    if m is None:
        return None
    return pb.MediaEngines(
        decoders=m.decoders,
        encoders=m.encoders,
        jpeg_decoders=m.jpeg_decoders,
        optical_flow=m.optical_flow,
        copy_engines=m.copy_engines,
    )


def _card_mode(request: pb.SetCardModeRequest) -> tuple[str, CardMode, SharingPolicy | None]:
    gpu = req.gpu_ref(request.gpu)
    mode = MODES.get(request.mode)
    if mode is None:
        raise InvalidField("mode", f"must be NONE, TDM or MIG, got {request.mode}")
    if request.sharing not in SHARING:
        raise InvalidField("sharing", f"must be DEFAULT, ISOLATED or SHARED, got {request.sharing}")
    return str(gpu), mode, SHARING[request.sharing]


def _create_request(request: pb.CreatePartitionRequest) -> CreateRequest:
    owner, ttl = req.owner_from_pb(request.owner)
    mig_profile, mig_start = req.mig_choice(request)
    return CreateRequest(
        owner=owner,
        gpu=str(req.gpu_ref(request.gpu, allow_any=True)),
        compute_percent=req.compute_percent(request.compute_percent),
        memory_mib=req.memory_mib(request.memory),
        request_id=req.request_id(request.request_id),
        lease_ttl_seconds=ttl,
        allow_faulty_gpus=request.allow_faulty_gpus,
        client_uid=req.client_uid(request),
        mig_profile=mig_profile,
        mig_placement_start=mig_start,
    )


def _partition_id(request: pb.GetPartitionRequest | pb.DeletePartitionRequest) -> str:
    return req.partition_id(request.id)


def _lease_renewal(request: pb.RenewLeaseRequest) -> tuple[str, float]:
    return req.partition_id(request.id), req.ttl_seconds(request.ttl_seconds)


def _gpu_filter(request: pb.ListPartitionsRequest | pb.GetCapacityRequest) -> str:
    """The card a read is about; "" for every card."""
    return str(req.gpu_ref(request.gpu, optional=True) or "")


def _card(gpu: str) -> tuple[str, str]:
    return ("gpu", gpu)


def _partition(pid: str) -> tuple[str, str]:
    return ("partition", pid)


Request = TypeVar("Request", bound=Message)
Response = TypeVar("Response", bound=Message)
Args = TypeVar("Args")
Act: TypeAlias = "Callable[[PartitionsService, Args], Awaitable[Response]]"
Handler: TypeAlias = (
    "Callable[[PartitionsService, Request, grpc.aio.ServicerContext[Request, Response]], Coroutine[Any, Any, Response]]"
)


def _rpc(
    parse: Callable[[Request], Args], resource: Callable[[Args], tuple[str, str]], *, writes: bool = False
) -> Callable[[Act[Args, Response]], Handler[Request, Response]]:
    """Every RPC one way: a change only on the admin socket; ``parse`` checks the request's fields (InvalidField ->
    INVALID_ARGUMENT with a BadRequest field violation); then, once the partitions are ready, the decorated method
    serves what ``parse`` returned, and a manager error becomes its status (a NOT_FOUND names ``resource`` of it in
    a ResourceInfo). The request checks come before readiness: a malformed request is wrong whenever it comes."""

    def decorate(act: Act[Args, Response]) -> Handler[Request, Response]:
        method = act.__name__

        @functools.wraps(act)
        async def handle(
            self: PartitionsService, request: Request, context: grpc.aio.ServicerContext[Request, Response]
        ) -> Response:
            if writes:
                self._require_write(method)
            try:
                args = parse(request)
            except InvalidField as exc:
                raise from_invalid_field(exc) from None
            self._require_ready()
            try:
                return await act(self, args)
            except PartitionError as exc:
                raise req.to_failure(exc, resource(args)) from None

        return handle

    return decorate


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

    @_rpc(_card_mode, lambda change: _card(change[0]), writes=True)
    async def SetCardMode(self, change: tuple[str, CardMode, SharingPolicy | None]) -> pb.CardCapacity:  # noqa: N802
        return capacity_to_pb(await self._m.set_mode(*change))

    @_rpc(_create_request, lambda create: _card(create.gpu), writes=True)
    async def CreatePartition(self, create: CreateRequest) -> pb.Partition:  # noqa: N802
        return partition_to_pb(self._m, await self._m.create(create))

    @_rpc(_partition_id, _partition)
    async def GetPartition(self, pid: str) -> pb.Partition:  # noqa: N802
        return partition_to_pb(self._m, self._m.get(pid))

    @_rpc(_gpu_filter, _card)
    async def ListPartitions(self, gpu: str) -> pb.ListPartitionsResponse:  # noqa: N802
        records = self._m.list_partitions(gpu)
        return pb.ListPartitionsResponse(partitions=[partition_to_pb(self._m, r) for r in records])

    @_rpc(_partition_id, _partition, writes=True)
    async def DeletePartition(self, pid: str) -> pb.DeletePartitionResponse:  # noqa: N802
        return pb.DeletePartitionResponse(id=pid, deleted=await self._m.delete(pid))

    @_rpc(_lease_renewal, lambda renewal: _partition(renewal[0]), writes=True)
    async def RenewLease(self, renewal: tuple[str, float]) -> pb.Partition:  # noqa: N802
        return partition_to_pb(self._m, await self._m.renew_lease(*renewal))

    @_rpc(_gpu_filter, _card)
    async def GetCapacity(self, gpu: str) -> pb.GetCapacityResponse:  # noqa: N802
        return pb.GetCapacityResponse(cards=[capacity_to_pb(c) for c in self._m.capacity(gpu)])
