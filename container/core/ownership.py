"""Who a front end's partitions belong to, in the daemon's API.

The device plugin creates a partition under a short lease that names the kubelet device, and the daemon hands it
to the pod that kubelet lists with that device (healthd/partition/podbind.py); either way the owner still names the
device. The DRA driver creates it for a ResourceClaim (namespace, name, uid), which the daemon never reclaims: the
driver deletes it on unprepare, or when it finds the claim gone."""

from __future__ import annotations

from healthd.api.v1 import partitions_pb2


def lease_for_device(holder: str, ttl_seconds: float, resource_name: str, device_id: str) -> partitions_pb2.Owner:
    """A lease owner that names the kubelet device the partition is for."""
    return partitions_pb2.Owner(
        lease=partitions_pb2.LeaseOwner(
            holder=holder,
            ttl_seconds=ttl_seconds,
            kubelet_device=partitions_pb2.KubeletDevice(resource_name=resource_name, device_id=device_id),
        )
    )


def claim_owner(namespace: str, name: str, uid: str) -> partitions_pb2.Owner:
    return partitions_pb2.Owner(claim=partitions_pb2.ClaimOwner(namespace=namespace, name=name, uid=uid))


def claim_uid_of(partition: partitions_pb2.Partition) -> str | None:
    """The uid of the ResourceClaim a partition was made for; None for every other owner."""
    if partition.owner.WhichOneof("kind") != "claim":
        return None
    return partition.owner.claim.uid


def kubelet_device_of(partition: partitions_pb2.Partition) -> tuple[str, str] | None:
    """(resource name, device id) a partition serves, whether it is still under its lease or already its pod's."""
    which = partition.owner.WhichOneof("kind")
    if which == "lease" and partition.owner.lease.HasField("kubelet_device"):
        device = partition.owner.lease.kubelet_device
    elif which == "pod" and partition.owner.pod.HasField("kubelet_device"):
        device = partition.owner.pod.kubelet_device
    else:
        return None
    return device.resource_name, device.device_id
