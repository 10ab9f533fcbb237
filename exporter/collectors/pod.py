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
    """Two blocks per pod, each kept while unchanged: its containers' SM sums; their memory sums and process
    counts with its allocations.

    The memory, counts and allocations block is versioned by the pod's layout (its containers on their cards,
    kept while each process's container, card, GPU instance and memory, in order, stay as they were) and kubelet's
    allocations (the same tuple while its answer is the same); the SM block by that layout and the containers' SM
    shares. So a pod costs a grouping step, its SM shares added up and two comparisons; only a changed block of it
    is written (on a busy node every pod's SM shares move every cycle, while its memory, counts and allocations
    stay)."""

    name = "pod"

    def __init__(self, source: Callable[[], Attribution | None]) -> None:
        self._source = source
        # kubelet's allocations by pod, for the allocations tuple they were grouped from (one reference, swapped
        # whole: a render and a families() call on another thread at worst both group the same tuple)
        self._grouped: tuple[tuple[Allocation, ...], dict[_Pod, tuple[Allocation, ...]]] = ((), {})
        self._layouts: dict[_Pod, _Layout] = {}  # by pod, from the last write (swapped whole, as _grouped)

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
        last, layouts = self._layouts, {}
        for key in sorted(procs.keys() | allocations.keys()):
            # two blocks: memory, counts and allocations, which stay while the processes' memory and containers
            # and kubelet's answer do; SM use, which moves with the processes (each family in one of them only,
            # so its lines keep their order). One block for the three that stay: on a busy node every pod's SM
            # block is written anew each render, and each block asked for costs a render its own bookkeeping
            mine = procs.get(key)
            processes = tuple(mine) if mine else ()
            held = tuple([(p.workload.container, p.uuid, p.gpu_instance_id, p.used_memory_bytes) for p in processes])
            layout = last.get(key)
            if layout is None or layout.held != held:
                layout = _Layout(key, held)
            layouts[key] = layout
            allocated = allocations.get(key, ())
            if (rows := out.block(("memory", key), (layout, allocated))) is not None:
                _memory(rows, layout)
                _allocated(rows, allocated)
            shares = _shares(layout, processes)
            if (rows := out.block(key, (layout, shares))) is not None:
                for (names, values), share in zip(layout.labels, shares, strict=True):
                    if share is not None:
                        rows.add_named(SM, names, values, share)
        self._layouts = layouts
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


class _Layout:
    """A pod's containers on their cards, from (container, uuid, GPU instance, memory) per process (``held``): each
    process's place among them (``slots``), and their label names and values, sorted by container, card and GPU
    instance (``labels``)."""

    __slots__ = ("held", "labels", "slots")

    def __init__(self, key: _Pod, held: tuple[tuple[str, str, str, int | None], ...]) -> None:
        first: dict[_Container, None] = dict.fromkeys((c, uuid, gi) for c, uuid, gi, _ in held)
        order = sorted(first)
        place = {c: i for i, c in enumerate(order)}
        self.held = held
        self.slots = tuple(place[(c, uuid, gi)] for c, uuid, gi, _ in held)
        self.labels = tuple(pod_labels(*key, *c) for c in order)


def _memory(rows: Rows, layout: _Layout) -> None:
    """Memory (summed in the processes' order) and process count per container and card."""
    memory: list[float | None] = [None] * len(layout.labels)
    count = [0.0] * len(layout.labels)
    for (_, _, _, used), slot in zip(layout.held, layout.slots, strict=True):
        if used is not None:
            memory[slot] = (memory[slot] or 0.0) + used
        count[slot] += 1
    for (names, values), used_sum, n in zip(layout.labels, memory, count, strict=True):
        if used_sum is not None:
            rows.add_named(MEMORY, names, values, used_sum)
        rows.add_named(COUNT, names, values, n)


def _shares(layout: _Layout, processes: tuple[AttributedProcess, ...]) -> tuple[float | None, ...]:
    """SM share per container and card in the layout's order (summed in the processes' order, at most 1): None for
    a container none of whose processes has one. Never -0.0 (a sum starts at 0.0), so equal shares print alike."""
    shares: list[float | None] = [None] * len(layout.labels)
    for p, slot in zip(processes, layout.slots, strict=True):
        if (ratio := p.sm_utilization_ratio) is not None:
            shares[slot] = (shares[slot] or 0.0) + ratio
    return tuple([None if share is None else min(1.0, share) for share in shares])


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
