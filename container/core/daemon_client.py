"""A container front end's only way to the daemon: xpu-healthd's public gRPC API on its unix sockets (reads on the
monitoring socket, partition changes on the admin socket). Nothing here imports the daemon's code, only its
generated stubs."""

from __future__ import annotations

from collections.abc import AsyncIterable

import grpc

from container.core.ownership import claim_owner, lease_for_device
from healthd.api.v1 import (
    health_pb2,
    health_pb2_grpc,
    partitions_pb2,
    partitions_pb2_grpc,
    topology_pb2,
    topology_pb2_grpc,
)

ACTIVE_FAULTS_LIMIT = 10000  # the API's maximum page


class DaemonClient:
    def __init__(self, address: str, admin_address: str, *, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._main = grpc.aio.insecure_channel(address)
        self._admin = grpc.aio.insecure_channel(admin_address)
        self._health = health_pb2_grpc.HealthStub(self._main)
        self._topology = topology_pb2_grpc.TopologyStub(self._main)
        self._partitions = partitions_pb2_grpc.PartitionsStub(self._main)
        self._admin_partitions = partitions_pb2_grpc.PartitionsStub(self._admin)

    def _deadline(self, within: float | None) -> float:
        """A call's deadline: the caller's bound when it has one shorter than the client's own."""
        return self.timeout if within is None else max(0.001, min(self.timeout, within))

    async def close(self) -> None:
        await self._main.close()
        await self._admin.close()

    # ----- health --------------------------------------------------------------------------------------------

    async def active_faults(self) -> tuple[list[health_pb2.Fault], int]:
        """(active faults, the journal's last seq read before they were listed): a watch from there misses nothing."""
        reply = await self._health.ListFaults(
            health_pb2.ListFaultsRequest(state=health_pb2.FAULT_STATE_ACTIVE, limit=ACTIVE_FAULTS_LIMIT),
            timeout=self.timeout,
        )
        return list(reply.faults), int(reply.last_seq)

    def watch_faults(self, after_seq: int) -> AsyncIterable[health_pb2.WatchFaultsResponse]:
        """The journal after ``after_seq``: replay, then live (no deadline: it runs as long as the daemon does)."""
        return self._health.WatchFaults(health_pb2.WatchFaultsRequest(after_seq=after_seq))

    # ----- topology ------------------------------------------------------------------------------------------

    async def topology(self, *, within: float | None = None) -> topology_pb2.GetTopologyResponse:
        return await self._topology.Get(topology_pb2.GetTopologyRequest(), timeout=self._deadline(within))

    async def preferred(
        self, count: int, available: list[str], must_include: list[str]
    ) -> topology_pb2.PreferredAllocationResponse:
        request = topology_pb2.PreferredAllocationRequest(count=count, available=available, must_include=must_include)
        return await self._topology.PreferredAllocation(request, timeout=self.timeout)

    # ----- partitions ----------------------------------------------------------------------------------------

    async def capacity(self, gpu: str = "", *, within: float | None = None) -> list[partitions_pb2.CardCapacity]:
        """Every card's capacity, or one card's (``gpu``: index or UUID)."""
        reply = await self._partitions.GetCapacity(
            partitions_pb2.GetCapacityRequest(gpu=gpu), timeout=self._deadline(within)
        )
        return list(reply.cards)

    async def partitions(self, *, within: float | None = None) -> list[partitions_pb2.Partition]:
        reply = await self._partitions.ListPartitions(
            partitions_pb2.ListPartitionsRequest(), timeout=self._deadline(within)
        )
        return list(reply.partitions)

    async def create_for_device(
        self,
        *,
        gpu_uuid: str,
        compute_percent: int,
        memory: str,
        resource_name: str,
        device_id: str,
        lease_seconds: float,
        within: float | None = None,
    ) -> partitions_pb2.Partition:
        """A partition under a lease that names the kubelet device; the daemon gives it to the pod kubelet lists."""
        owner = lease_for_device("xpu-device-plugin", lease_seconds, resource_name, device_id)
        request = partitions_pb2.CreatePartitionRequest(
            owner=owner, gpu=gpu_uuid, compute_percent=compute_percent, memory=memory
        )
        # a MIG create may take the daemon's whole change deadline: the caller's bound, not the read timeout
        return await self._admin_partitions.CreatePartition(request, timeout=within or self.timeout)

    async def renew_lease(
        self, partition_id: str, ttl_seconds: float, *, within: float | None = None
    ) -> partitions_pb2.Partition:
        request = partitions_pb2.RenewLeaseRequest(id=partition_id, ttl_seconds=ttl_seconds)
        return await self._admin_partitions.RenewLease(request, timeout=self._deadline(within))

    async def create_for_claim(
        self,
        claim: tuple[str, str, str],
        *,
        gpu_uuid: str,
        request_id: str,
        compute_percent: int = 0,
        memory: str = "",
        mig_profile: str = "",
        mig_placement_start: int | None = None,
        within: float | None = None,
    ) -> partitions_pb2.Partition:
        """A partition owned by a ResourceClaim (namespace, name, uid); a retry with the same ``request_id`` returns
        the same partition. MIG: ``mig_profile`` at ``mig_placement_start``, as the scheduler allocated it."""
        request = partitions_pb2.CreatePartitionRequest(
            owner=claim_owner(*claim),
            gpu=gpu_uuid,
            compute_percent=compute_percent,
            memory=memory,
            request_id=request_id,
            mig_profile=mig_profile,
        )
        if mig_placement_start is not None:
            request.mig_placement_start = mig_placement_start
        # a MIG create may take the daemon's whole change deadline: the caller's bound, not the read timeout
        return await self._admin_partitions.CreatePartition(request, timeout=within or self.timeout)

    async def delete_partition(self, partition_id: str, *, within: float | None = None) -> bool:
        reply = await self._admin_partitions.DeletePartition(
            partitions_pb2.DeletePartitionRequest(id=partition_id), timeout=self._deadline(within)
        )
        return bool(reply.deleted)
