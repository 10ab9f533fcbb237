"""Per pod/container GPU metrics: memory and SM use summed over the container's own processes, and which
devices kubelet allocated to it. Label ``uuid`` (and ``gpu_instance_id`` on MIG, absent on a whole card) joins with
card and MIG metrics; the card's index and model are on ``xpu_gpu_info``, not repeated here.

On a shared card each container gets only its own processes' usage. Processes whose pod cannot be told apart
(and the MPS server, which runs every client's work) are in no pod's sums; a container with no attributed
process has no usage series, because "unknown" must not read as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.attribution.attributor import Attribution
from exporter.collectors.base import NoDataError
from exporter.snapshot import Snapshot


def pod_labels(namespace: str, pod: str, container: str, uuid: str, gpu_instance_id: str) -> dict[str, str]:
    labels = {"namespace": namespace, "pod": pod, "container": container, "uuid": uuid}
    if gpu_instance_id:
        labels["gpu_instance_id"] = gpu_instance_id
    return labels


class PodCollector:
    name = "pod"

    def __init__(self, source: Callable[[], Attribution | None]) -> None:
        self._source = source

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        attribution = self._source()
        if attribution is None:
            raise NoDataError("no attribution yet")
        memory = GaugeMetricFamily(
            "xpu_pod_gpu_memory_used_bytes",
            "GPU memory used by the container's processes on the card (sum of usedGpuMemory).",
        )
        sm = GaugeMetricFamily(
            "xpu_pod_sm_utilization_ratio",
            "Share of the card's SM time the container's processes used (sum of nvmlDeviceGetProcessUtilization).",
        )
        count = GaugeMetricFamily("xpu_pod_gpu_processes", "Compute processes of the container on the card.")
        allocated = GaugeMetricFamily(
            "xpu_pod_gpu_allocated",
            "1 for each device kubelet allocated to the container (pod-resources List); device_id as kubelet "
            "reports it (GPU-..., MIG-..., with ::N for a shared replica).",
        )
        sums: dict[tuple[str, ...], list[float | None]] = {}  # key -> [memory, sm, processes]
        for p in attribution.processes:
            w = p.workload
            if not w.pod or p.mps_server:
                continue
            key = (w.namespace, w.pod, w.container, p.uuid, p.gpu_instance_id)
            acc = sums.setdefault(key, [None, None, 0.0])
            if p.used_memory_bytes is not None:
                acc[0] = (acc[0] or 0.0) + p.used_memory_bytes
            if p.sm_utilization_ratio is not None:
                acc[1] = (acc[1] or 0.0) + p.sm_utilization_ratio
            acc[2] = (acc[2] or 0.0) + 1
        for (namespace, pod, container, uuid, gi), (mem, util, n) in sorted(sums.items()):
            labels = pod_labels(namespace, pod, container, uuid, gi)
            if mem is not None:
                memory.add_sample(memory.name, labels, mem)
            if util is not None:
                sm.add_sample(sm.name, labels, min(1.0, util))
            count.add_sample(count.name, labels, n or 0.0)
        for a in sorted(set(attribution.allocations), key=lambda a: (a.namespace, a.pod, a.container, a.device_id)):
            labels = pod_labels(a.namespace, a.pod, a.container, a.uuid, a.gpu_instance_id)
            allocated.add_sample(allocated.name, {**labels, "resource": a.resource_name, "device_id": a.device_id}, 1.0)
        return (memory, sm, count, allocated, *self._kubelet(attribution))

    @staticmethod
    def _kubelet(attribution: Attribution) -> Iterable[Metric]:
        view = attribution.kubelet
        if view is None or view.state in ("absent", "stopped"):
            return ()  # not a Kubernetes node (or the client is off): no kubelet series at all
        up = GaugeMetricFamily(
            "xpu_kubelet_pod_resources_up",
            "Whether the last kubelet pod-resources refresh succeeded (1) or failed (0).",
            value=1.0 if view.state == "ok" else 0.0,
        )
        families: list[Metric] = [up]
        if view.last_success is not None:
            families.append(
                GaugeMetricFamily(
                    "xpu_kubelet_pod_resources_last_success_timestamp_seconds",
                    "Unix time of the last successful pod-resources refresh.",
                    value=view.last_success,
                )
            )
        allocatable = GaugeMetricFamily(
            "xpu_kubelet_allocatable_devices",
            "Devices kubelet can allocate, by resource (pod-resources GetAllocatableResources).",
            labels=["resource"],
        )
        counts: dict[str, int] = {}
        for resource, _device_id in view.allocatable:
            counts[resource] = counts.get(resource, 0) + 1
        for resource, n in sorted(counts.items()):
            allocatable.add_metric([resource], float(n))
        families.append(allocatable)
        families.append(
            GaugeMetricFamily(
                "xpu_kubelet_pod_resources_unmatched_devices",
                "Allocated device ids that name no GPU or MIG device of this node.",
                value=float(attribution.unmatched_device_ids),
            )
        )
        return families
