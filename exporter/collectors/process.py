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

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.attribution.attributor import AttributedProcess, Attribution
from exporter.collectors.base import GPU_LABELS, NoDataError
from exporter.snapshot import Snapshot

PROCESS_LABELS = ("uuid", "pid", "process", "namespace", "pod", "container")  # on every series
OTHER = "other"


def process_labels(p: AttributedProcess) -> dict[str, str]:
    w = p.workload
    labels = {
        "uuid": p.uuid,
        "pid": str(p.pid),
        "process": p.name,
        "namespace": w.namespace,
        "pod": w.pod,
        "container": w.container,
    }
    if p.gpu_instance_id:
        labels["gpu_instance_id"] = p.gpu_instance_id
    if w.job:
        labels["slurm_job"] = w.job
    return labels


class ProcessCollector:
    name = "process"

    def __init__(self, source: Callable[[], Attribution | None], *, max_per_gpu: int = 64) -> None:
        if max_per_gpu < 1:
            raise ValueError("max_per_gpu must be >= 1")
        self._source = source
        self.max_per_gpu = max_per_gpu

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        attribution = self._source()
        if attribution is None:
            raise NoDataError("no attribution yet")
        memory = GaugeMetricFamily(
            "xpu_process_gpu_memory_used_bytes",
            "GPU memory used by the process (nvmlDeviceGetComputeRunningProcesses usedGpuMemory).",
        )
        sm = GaugeMetricFamily(
            "xpu_process_sm_utilization_ratio",
            "Share of the card's SM time the process used in the last sample (nvmlDeviceGetProcessUtilization).",
        )
        folded = GaugeMetricFamily(
            "xpu_process_folded",
            'Processes beyond the per-GPU series limit, summed into the series with pid="" and process="other".',
            labels=list(GPU_LABELS),
        )
        by_gpu: dict[tuple[int, str], list[AttributedProcess]] = {}
        for p in attribution.processes:
            by_gpu.setdefault((p.gpu, p.uuid), []).append(p)
        for (gpu, uuid), procs in sorted(by_gpu.items()):
            procs.sort(key=lambda p: (-(p.used_memory_bytes or 0), p.pid))
            kept, rest = procs[: self.max_per_gpu], procs[self.max_per_gpu :]
            for p in kept:
                labels = process_labels(p)
                if p.used_memory_bytes is not None:
                    memory.add_sample(memory.name, labels, float(p.used_memory_bytes))
                if p.sm_utilization_ratio is not None:
                    sm.add_sample(sm.name, labels, p.sm_utilization_ratio)
            folded.add_metric([str(gpu), uuid], float(len(rest)))
            if rest:
                labels = {**dict.fromkeys(PROCESS_LABELS, ""), "uuid": uuid, "process": OTHER}
                mem_known = [p.used_memory_bytes for p in rest if p.used_memory_bytes is not None]
                sm_known = [p.sm_utilization_ratio for p in rest if p.sm_utilization_ratio is not None]
                if mem_known:
                    memory.add_sample(memory.name, labels, float(sum(mem_known)))
                if sm_known:
                    sm.add_sample(sm.name, labels, min(1.0, sum(sm_known)))
        return (memory, sm, folded)
