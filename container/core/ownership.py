"""Which kubelet device a partition serves, in the daemon's API: a front end creates the partition under a short
lease that names the device, and the daemon hands it to the pod that kubelet lists with that device
(healthd/partition/podbind.py); either way the owner still names the device."""

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
