"""Partitions that follow pods: a lease that names a kubelet device becomes a pod owner once kubelet lists it.

A device plugin's Allocate does not say which pod it serves, so the plugin creates the partition under a short
lease that names the device id it handed out (LeaseOwner.kubelet_device). Kubelet's pod-resources API lists that id
under the pod and container it went to as soon as the pod is admitted; each reconcile pass looks, and makes that
pod the owner (PodOwner with the same device). From then on the partition lives while kubelet lists the device for
that pod. A pod that never appears (its admission failed after Allocate) leaves the lease to run out: reclaimed.

Only a List sent after the partition was created can say whose it is: an older one may still show the device under
the pod that had it before (a slot reused at once), and binding to that pod would get the partition deleted under
the new pod once the old one's entry goes.
"""

from __future__ import annotations

import structlog

from healthd.partition.errors import PartitionError
from healthd.partition.manager import PartitionManager
from healthd.partition.model import Owner, OwnerKind, State
from healthd.partition.owners import DeviceHolders

log = structlog.get_logger("partition.podbind")


async def bind_to_pods(manager: PartitionManager, holders: DeviceHolders) -> list[str]:
    """One pass: rebind every ready kubelet-device lease whose device kubelet now lists; returns their ids."""
    listed = holders()
    if listed is None:
        return []  # kubelet's answer is not current: nothing to learn, nothing to change
    bound = []
    for record in manager.list_partitions():
        owner = record.owner
        if owner.kind is not OwnerKind.LEASE or not owner.device_id or record.state is not State.READY:
            continue
        if listed.listed_at <= record.created_at:
            continue  # asked before this partition existed: it may name the device's previous pod
        holder = listed.holders.get((owner.resource_name, owner.device_id))
        if holder is None:
            continue
        namespace, pod, container = holder
        pod_owner = Owner(
            OwnerKind.POD,
            namespace=namespace,
            pod=pod,
            container=container,
            resource_name=owner.resource_name,
            device_id=owner.device_id,
        )
        try:
            await manager.rebind(record.id, pod_owner)
        except PartitionError as exc:  # deleted meanwhile, or kubelet reported a name we cannot keep
            log.warning("cannot give partition to its pod", partition=record.id, error=exc.message)
            continue
        bound.append(record.id)
    return bound
