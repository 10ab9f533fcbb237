"""ResourceClaims in the shapes kube-scheduler writes for this driver's devices, for the stand-in API server.

Written from the API and the KEPs, not from the driver's code: k8s.io/api resource/v1/types.go (@10b39a3,
2026-07-24: ResourceClaimStatus, AllocationResult, DeviceRequestAllocationResult, ResourceClaimConsumerReference)
and kubernetes/enhancements (@64765b4) keps/sig-node/4381-dra-structured-parameters (status.allocation with
devices.results and nodeSelector, status.reservedFor naming the pod), keps/sig-scheduling/5075-dra-consumable-
capacity ("ResourceClaim's status": consumedCapacity and shareID on a result; every capacity of the device is
listed, rounded up to the request policy), keps/sig-scheduling/4815-dra-partitionable-devices (a partition is
allocated like any device: its name; the counters it consumes are the scheduler's bookkeeping, not in the claim),
keps/sig-scheduling/5055-dra-device-taints-and-tolerations (the request's tolerations copied into the result),
keps/sig-scheduling/5004-dra-extended-resource (a claim the scheduler makes for ``xpu-runtime-kit.io/gpu: 1``,
owned by the pod, with a request per container named ``container-<i>-request-<j>``) and
keps/sig-node/4680-add-resource-health-to-pod-status (health comes from the driver, nothing in the claim).
"""

from __future__ import annotations

import uuid
from typing import Any

DRIVER = "gpu.xpu-runtime-kit.io"


def _node_selector(node: str) -> dict[str, Any]:
    # allocator: a node-local pool's devices are reachable on that node only (metadata.name field of the Node)
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def claim(
    name: str,
    namespace: str,
    requests: list[dict[str, Any]],
    results: list[dict[str, Any]],
    node: str,
    pod: tuple[str, str],
    *,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A claim as the scheduler leaves it: allocated on ``node`` and reserved for ``pod`` (name, uid)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {"devices": {"results": results}, "nodeSelector": _node_selector(node)},
            "reservedFor": [{"resource": "pods", "name": pod[0], "uid": pod[1]}],
        },
    }


def whole_card(name: str, namespace: str, node: str, device: str, pod: tuple[str, str]) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.xpu-runtime-kit.io", "count": 1}}
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    return claim(name, namespace, [request], [result], node, pod)


def tdm_share(
    name: str, namespace: str, node: str, device: str, pod: tuple[str, str], *, compute: str, memory: str
) -> dict[str, Any]:
    """A share of a consumable-capacity device: consumedCapacity lists every capacity, shareID is the share's."""
    request = {
        "name": "tdm",
        "exactly": {
            "deviceClassName": "tdm.gpu.xpu-runtime-kit.io",
            "capacity": {"requests": {"compute": compute, "memory": memory}},
        },
    }
    result = {
        "request": "tdm",
        "driver": DRIVER,
        "pool": node,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"compute": compute, "memory": memory},
    }
    return claim(name, namespace, [request], [result], node, pod)


def mig_partition(name: str, namespace: str, node: str, device: str, pod: tuple[str, str]) -> dict[str, Any]:
    request = {"name": "mig", "exactly": {"deviceClassName": "mig.gpu.xpu-runtime-kit.io"}}
    result = {"request": "mig", "driver": DRIVER, "pool": node, "device": device}
    return claim(name, namespace, [request], [result], node, pod)


def tolerating(claim_obj: dict[str, Any], taint_value: str, effect: str = "NoSchedule") -> dict[str, Any]:
    """The same claim whose request tolerates one fault taint: the toleration is copied into the result."""
    toleration = {"key": "xpu-runtime-kit.io/fault", "operator": "Equal", "value": taint_value, "effect": effect}
    for request in claim_obj["spec"]["devices"]["requests"]:
        request["exactly"]["tolerations"] = [toleration]
    for result in claim_obj["status"]["allocation"]["devices"]["results"]:
        result["tolerations"] = [toleration]
    return claim_obj


def extended_resource(namespace: str, node: str, devices: list[str], pod: tuple[str, str]) -> dict[str, Any]:
    """KEP-5004: the claim the scheduler creates for a pod asking for ``xpu-runtime-kit.io/gpu: N`` (one container),
    owned by the pod and annotated ``resource.kubernetes.io/extended-resource-claim: <pod name>``; its name is
    generated (the KEP does not fix it); the pod's status.extendedResourceClaimStatus names it."""
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1], "controller": True}
    request = {
        "name": "container-0-request-0",
        "exactly": {"deviceClassName": "gpu.xpu-runtime-kit.io", "count": len(devices)},
    }
    results = [{"request": "container-0-request-0", "driver": DRIVER, "pool": node, "device": d} for d in devices]
    generated = claim(f"{pod[0]}-extended-resources-x7k2p", namespace, [request], results, node, pod, owner=owner)
    generated["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": pod[0]}
    return generated
