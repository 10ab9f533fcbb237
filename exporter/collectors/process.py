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

from exporter.attribution.attributor import AttributedProcess, Attribution
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
    """One block per card, kept while the card's attributed processes are unchanged."""

    name = "process"

    def __init__(self, source: Callable[[], Attribution | None], *, max_per_gpu: int = 64) -> None:
        if max_per_gpu < 1:
            raise ValueError("max_per_gpu must be >= 1")
        self._source = source
        self.max_per_gpu = max_per_gpu

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        attribution = self._source()
        if attribution is None:
            raise NoDataError("no attribution yet")
        out.declare(MEMORY, SM, FOLDED)
        by_gpu: dict[tuple[int, str], list[AttributedProcess]] = {}
        for p in attribution.processes:
            by_gpu.setdefault((p.gpu, p.uuid), []).append(p)
        for key, procs in sorted(by_gpu.items()):
            rows = out.block(key, (tuple(procs), self.max_per_gpu))
            if rows is not None:
                self._card(rows, key, procs)

    def _card(self, rows: Rows, card: tuple[int, str], procs: list[AttributedProcess]) -> None:
        gpu, uuid = card
        procs.sort(key=lambda p: (-(p.used_memory_bytes or 0), p.pid))
        kept, rest = procs[: self.max_per_gpu], procs[self.max_per_gpu :]
        for p in kept:
            names, values = process_labels(p)
            if p.used_memory_bytes is not None:
                rows.add_named(MEMORY, names, values, float(p.used_memory_bytes))
            if p.sm_utilization_ratio is not None:
                rows.add_named(SM, names, values, p.sm_utilization_ratio)
        rows.add(FOLDED, (str(gpu), uuid), float(len(rest)))
        if rest:
            other = (uuid, "", OTHER, "", "", "")
            mem_known = [p.used_memory_bytes for p in rest if p.used_memory_bytes is not None]
            sm_known = [p.sm_utilization_ratio for p in rest if p.sm_utilization_ratio is not None]
            if mem_known:
                rows.add_named(MEMORY, PROCESS_LABELS, other, float(sum(mem_known)))
            if sm_known:
                rows.add_named(SM, PROCESS_LABELS, other, min(1.0, sum(sm_known)))
