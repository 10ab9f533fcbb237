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

    async def topology(self) -> topology_pb2.GetTopologyResponse:
        return await self._topology.Get(topology_pb2.GetTopologyRequest(), timeout=self.timeout)

    async def preferred(
        self, count: int, available: list[str], must_include: list[str]
    ) -> topology_pb2.PreferredAllocationResponse:
        request = topology_pb2.PreferredAllocationRequest(count=count, available=available, must_include=must_include)
        return await self._topology.PreferredAllocation(request, timeout=self.timeout)

    # ----- partitions ----------------------------------------------------------------------------------------

    async def capacity(self) -> list[partitions_pb2.CardCapacity]:
        reply = await self._partitions.GetCapacity(partitions_pb2.GetCapacityRequest(), timeout=self.timeout)
        return list(reply.cards)

    async def partitions(self) -> list[partitions_pb2.Partition]:
        reply = await self._partitions.ListPartitions(partitions_pb2.ListPartitionsRequest(), timeout=self.timeout)
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
    ) -> partitions_pb2.Partition:
        """A partition under a lease that names the kubelet device; the daemon gives it to the pod kubelet lists."""
        owner = lease_for_device("xpu-device-plugin", lease_seconds, resource_name, device_id)
        request = partitions_pb2.CreatePartitionRequest(
            owner=owner, gpu=gpu_uuid, compute_percent=compute_percent, memory=memory
        )
        return await self._admin_partitions.CreatePartition(request, timeout=self.timeout)

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
        return await self._admin_partitions.CreatePartition(request, timeout=self.timeout)

    async def delete_partition(self, partition_id: str) -> bool:
        reply = await self._admin_partitions.DeletePartition(
            partitions_pb2.DeletePartitionRequest(id=partition_id), timeout=self.timeout
        )
        return bool(reply.deleted)
