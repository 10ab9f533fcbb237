"""Per-process GPU metrics: memory and SM use of each compute process, with its container, pod or Slurm job.

Series exist only while the process runs (fresh families per render). ``max_per_gpu`` bounds cardinality: the
processes using the most memory keep their own series, the rest are summed into one series per card with
``pid=""`` and ``process="other"``, and ``xpu_process_folded`` says how many were folded. A Slurm job is labelled
``slurm_job`` (not ``job``, which is the Prometheus target label every scrape already carries).

Labels: the card's ``uuid`` (join with ``xpu_gpu_info`` for its index and model: the card's other labels are not
repeated on every process), ``pid``, ``process``, and ``namespace``, ``pod``, ``container`` always, empty when not in
a pod (so that under ``honor_labels`` Prometheus does not fill them in with the target's). ``gpu_instance_id`` (MIG)
and ``slurm_job`` only when set: an empty label is the same as no label to Prometheus, and costs bytes on every
series.
"""

from __future__ import annotations

from collections.abc import Callable
from math import copysign

from exporter.attribution.attributor import AttributedProcess, Attribution, Workload
from exporter.collectors.base import GPU_LABELS, NoDataError
from exporter.collectors.series import Exposer, Family, Rows, SeriesCollector
from exporter.snapshot import Snapshot

PROCESS_LABELS = ("uuid", "pid", "process", "namespace", "pod", "container")  # on every series
OTHER = "other"

MEMORY = Family(
    "xpu_process_gpu_memory_used_bytes",
    "GPU memory used by the process (nvmlDeviceGetComputeRunningProcesses usedGpuMemory).",
)
SM = Family(
    "xpu_process_sm_utilization_ratio",
    "Share of the card's SM time the process used in the last sample (nvmlDeviceGetProcessUtilization).",
)
FOLDED = Family(
    "xpu_process_folded",
    'Processes beyond the per-GPU series limit, summed into the series with pid="" and process="other".',
    labels=GPU_LABELS,
)
_WITH_INSTANCE = (*PROCESS_LABELS, "gpu_instance_id")
_WITH_JOB = (*PROCESS_LABELS, "slurm_job")
_WITH_BOTH = (*PROCESS_LABELS, "gpu_instance_id", "slurm_job")


def process_labels(p: AttributedProcess) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(label names, label values) of a process's series."""
    w = p.workload
    values: tuple[str, ...] = (p.uuid, str(p.pid), p.name, w.namespace, w.pod, w.container)
    if p.gpu_instance_id and w.job:
        return _WITH_BOTH, (*values, p.gpu_instance_id, w.job)
    if p.gpu_instance_id:
        return _WITH_INSTANCE, (*values, p.gpu_instance_id)
    if w.job:
        return _WITH_JOB, (*values, w.job)
    return PROCESS_LABELS, values


class ProcessCollector(SeriesCollector):
    """Two blocks per card, each kept while unchanged: its processes' memory (and the folded count), and their SM
    shares.

    The memory block is versioned by the card's layout: which processes keep their own series, in which order,
    with which labels, kept while each process's pid, name, GPU instance, workload and memory (in attribution's
    order) stay as they were; the SM block by that layout and the shares. On a busy node every process's SM share
    moves every cycle while its memory stays: only the SM lines are written."""

    name = "process"

    def __init__(self, source: Callable[[], Attribution | None], *, max_per_gpu: int = 64) -> None:
        if max_per_gpu < 1:
            raise ValueError("max_per_gpu must be >= 1")
        self._source = source
        self.max_per_gpu = max_per_gpu
        # by card, from the last write (one reference, swapped whole: a render and a families() call on another
        # thread at worst both make a card's layout)
        self._layouts: dict[tuple[int, str], _Layout] = {}

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        attribution = self._source()
        if attribution is None:
            raise NoDataError("no attribution yet")
        out.declare(MEMORY, SM, FOLDED)
        by_gpu: dict[tuple[int, str], list[AttributedProcess]] = {}
        for p in attribution.processes:
            by_gpu.setdefault((p.gpu, p.uuid), []).append(p)
        limit, last, layouts = self.max_per_gpu, self._layouts, {}
        for key, procs in sorted(by_gpu.items()):
            held = tuple([(p.pid, p.name, p.gpu_instance_id, p.workload, p.used_memory_bytes) for p in procs])
            layout = last.get(key)
            if layout is None or layout.held != held or layout.limit != limit:
                layout = _Layout(procs, held, limit)
            layouts[key] = layout
            if (rows := out.block(("memory", key), layout)) is not None:
                _memory(rows, key, layout)
            shares = [procs[i].sm_utilization_ratio for i in layout.kept]
            rest = [r for i in layout.rest if (r := procs[i].sm_utilization_ratio) is not None]
            other = min(1.0, sum(rest)) if rest else None  # a sum starts at 0: never -0.0
            # 0.0 and -0.0 are equal but print apart: a zero's sign is part of the version
            signs = tuple([copysign(1.0, r) for r in shares if r is not None and r == 0.0])
            if (rows := out.block(key, (layout, tuple(shares), other, signs))) is not None:
                for (names, values), share in zip(layout.labels, shares, strict=True):
                    if share is not None:
                        rows.add_named(SM, names, values, share)
                if other is not None:
                    rows.add_named(SM, PROCESS_LABELS, (key[1], "", OTHER, "", "", ""), other)
        self._layouts = layouts


class _Layout:
    """A card's processes as their series show them: the ``limit`` using the most memory (``kept``, indices into
    attribution's order, most memory first) with their label names and values (``labels``), and the rest folded
    (``rest``), from (pid, name, GPU instance, workload, memory) per process (``held``)."""

    __slots__ = ("held", "kept", "labels", "limit", "rest")

    def __init__(
        self,
        procs: list[AttributedProcess],
        held: tuple[tuple[int, str, str, Workload, int | None], ...],
        limit: int,
    ) -> None:
        order = sorted(range(len(procs)), key=lambda i: (-(procs[i].used_memory_bytes or 0), procs[i].pid))
        self.held, self.limit = held, limit
        self.kept, self.rest = tuple(order[:limit]), tuple(order[limit:])
        self.labels = tuple(process_labels(procs[i]) for i in self.kept)


def _memory(rows: Rows, card: tuple[int, str], layout: _Layout) -> None:
    gpu, uuid = card
    held = layout.held
    for i, (names, values) in zip(layout.kept, layout.labels, strict=True):
        if (used := held[i][4]) is not None:
            rows.add_named(MEMORY, names, values, float(used))
    rows.add(FOLDED, (str(gpu), uuid), float(len(layout.rest)))
    rest = [used for i in layout.rest if (used := held[i][4]) is not None]
    if rest:
        rows.add_named(MEMORY, PROCESS_LABELS, (uuid, "", OTHER, "", "", ""), float(sum(rest)))
