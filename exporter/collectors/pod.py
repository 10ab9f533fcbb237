"""Per pod/container GPU metrics: memory and SM use summed over the container's own processes, and which
devices kubelet allocated to it. Label ``uuid`` (and ``gpu_instance_id`` on MIG, absent on a whole card) joins with
card and MIG metrics; the card's index and model are on ``xpu_gpu_info``, not repeated here.

On a shared card each container gets only its own processes' usage. Processes whose pod cannot be told apart
(and the MPS server, which runs every client's work) are in no pod's sums; a container with no attributed
process has no usage series, because "unknown" must not read as 0.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.attribution.attributor import Allocation, AttributedProcess, Attribution
from exporter.attribution.kubelet import PodResourcesView
from exporter.collectors.base import NoDataError
from exporter.collectors.series import Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import Snapshot

POD_LABELS = ("namespace", "pod", "container", "uuid")
_MIG_LABELS = (*POD_LABELS, "gpu_instance_id")
_ALLOCATION = ("resource", "device_id")

MEMORY = Family(
    "xpu_pod_gpu_memory_used_bytes",
    "GPU memory used by the container's processes on the card (sum of usedGpuMemory).",
)
SM = Family(
    "xpu_pod_sm_utilization_ratio",
    "Share of the card's SM time the container's processes used (sum of nvmlDeviceGetProcessUtilization).",
)
COUNT = Family("xpu_pod_gpu_processes", "Compute processes of the container on the card.")
ALLOCATED = Family(
    "xpu_pod_gpu_allocated",
    "1 for each device kubelet allocated to the container (pod-resources List); device_id as kubelet "
    "reports it (GPU-..., MIG-..., with ::N for a shared replica).",
)
KUBELET_UP = Family(
    "xpu_kubelet_pod_resources_up", "Whether the last kubelet pod-resources refresh succeeded (1) or failed (0)."
)
KUBELET_LAST_SUCCESS = Family(
    "xpu_kubelet_pod_resources_last_success_timestamp_seconds",
    "Unix time of the last successful pod-resources refresh.",
)
ALLOCATABLE = Family(
    "xpu_kubelet_allocatable_devices",
    "Devices kubelet can allocate, by resource (pod-resources GetAllocatableResources).",
    labels=("resource",),
)
UNMATCHED = Family(
    "xpu_kubelet_pod_resources_unmatched_devices",
    "Allocated device ids that name no GPU or MIG device of this node.",
)

_Pod = tuple[str, str]  # namespace, pod
_Container = tuple[str, str, str]  # container, uuid, gpu_instance_id


def pod_labels(
    namespace: str, pod: str, container: str, uuid: str, gpu_instance_id: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(label names, label values) of a container's series on one card or MIG instance."""
    if gpu_instance_id:
        return _MIG_LABELS, (namespace, pod, container, uuid, gpu_instance_id)
    return POD_LABELS, (namespace, pod, container, uuid)


class PodCollector(SeriesCollector):
    """Two blocks per pod, its containers' sums and its allocations, each kept while unchanged.

    The sums' block is versioned by the pod's processes as attribution gave them (the Attributor hands back the
    same objects for unchanged processes), the allocations' by kubelet's (the same tuple while its answer is), so
    an unchanged pod costs a grouping step and two comparisons; only a changed pod has its sums added up and its
    lines written, and a pod whose usage moved keeps its allocation lines."""

    name = "pod"

    def __init__(self, source: Callable[[], Attribution | None]) -> None:
        self._source = source
        # kubelet's allocations by pod, for the allocations tuple they were grouped from (one reference, swapped
        # whole: a render and a families() call on another thread at worst both group the same tuple)
        self._grouped: tuple[tuple[Allocation, ...], dict[_Pod, tuple[Allocation, ...]]] = ((), {})

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        attribution = self._source()
        if attribution is None:
            raise NoDataError("no attribution yet")
        out.declare(MEMORY, SM, COUNT, ALLOCATED)
        procs: dict[_Pod, list[AttributedProcess]] = {}
        for p in attribution.processes:
            w = p.workload
            if w.pod and not p.mps_server:
                key = (w.namespace, w.pod)
                found = procs.get(key)
                if found is None:
                    procs[key] = [p]
                else:
                    found.append(p)
        allocations = self._allocations(attribution.allocations)
        for key in sorted(procs.keys() | allocations.keys()):
            # two blocks: usage, which moves with the processes, and allocations, which stay while kubelet's
            # answer does (each family in one of them only, so its lines keep their order)
            mine = procs.get(key)
            processes = tuple(mine) if mine else ()
            if (rows := out.block(key, processes)) is not None:
                _usage(rows, key, processes)
            held = allocations.get(key, ())
            if (rows := out.block(("allocated", key), held)) is not None:
                _allocated(rows, held)
        _kubelet(out, attribution.kubelet, attribution.unmatched_device_ids)

    def _allocations(self, allocations: tuple[Allocation, ...]) -> dict[_Pod, tuple[Allocation, ...]]:
        grouped = self._grouped
        if grouped[0] is allocations:
            return grouped[1]
        by_pod: dict[_Pod, set[Allocation]] = {}
        for a in allocations:
            by_pod.setdefault((a.namespace, a.pod), set()).add(a)
        out = {k: tuple(sorted(v, key=lambda a: (a.container, a.device_id))) for k, v in by_pod.items()}
        self._grouped = (allocations, out)
        return out


def _usage(rows: Rows, key: _Pod, processes: tuple[AttributedProcess, ...]) -> None:
    namespace, pod = key
    sums: dict[_Container, list[float | None]] = {}
    for p in processes:
        acc = sums.setdefault((p.workload.container, p.uuid, p.gpu_instance_id), [None, None, 0.0])
        if p.used_memory_bytes is not None:
            acc[0] = (acc[0] or 0.0) + p.used_memory_bytes
        if p.sm_utilization_ratio is not None:
            acc[1] = (acc[1] or 0.0) + p.sm_utilization_ratio
        acc[2] = (acc[2] or 0.0) + 1
    for (container, uuid, gi), (mem, util, n) in sorted(sums.items()):  # by container, card, GPU instance
        names, values = pod_labels(namespace, pod, container, uuid, gi)
        if mem is not None:
            rows.add_named(MEMORY, names, values, mem)
        if util is not None:
            rows.add_named(SM, names, values, min(1.0, util))
        rows.add_named(COUNT, names, values, n or 0.0)


def _allocated(rows: Rows, allocs: tuple[Allocation, ...]) -> None:
    for a in allocs:
        names, values = pod_labels(a.namespace, a.pod, a.container, a.uuid, a.gpu_instance_id)
        rows.add_named(ALLOCATED, (*names, *_ALLOCATION), (*values, a.resource_name, a.device_id), 1.0)


def _kubelet(out: Exposer, view: PodResourcesView | None, unmatched: int) -> None:
    if view is None or view.state in ("absent", "stopped"):
        return  # not a Kubernetes node (or the client is off): no kubelet series at all
    out.declare(KUBELET_UP)
    if view.last_success is not None:
        out.declare(KUBELET_LAST_SUCCESS)
    out.declare(ALLOCATABLE, UNMATCHED)
    rows = out.block("kubelet", (view.state, view.last_success, view.allocatable, unmatched))
    if rows is None:
        return
    rows.add(KUBELET_UP, (), 1.0 if view.state == "ok" else 0.0)
    if view.last_success is not None:
        rows.add(KUBELET_LAST_SUCCESS, (), view.last_success)
    counts: dict[str, int] = {}
    for resource, _device_id in view.allocatable:
        counts[resource] = counts.get(resource, 0) + 1
    for resource, n in sorted(counts.items()):
        rows.add(ALLOCATABLE, (resource,), float(n))
    rows.add(UNMATCHED, (), float(unmatched))
