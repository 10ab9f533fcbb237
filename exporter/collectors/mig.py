"""Per-MIG-instance metrics: identity, size and memory in use, for cards with MIG on."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.backends.types import Unsupported
from exporter.collectors.base import GPU_LABELS, gpu_label_values
from exporter.snapshot import Snapshot

MIG_LABELS = (*GPU_LABELS, "gpu_instance_id")


class MigCollector:
    name = "mig"

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        labels = list(MIG_LABELS)
        info = InfoMetricFamily(
            "xpu_mig_instance",
            "A MIG device (GPU instance and its compute instance); join on uuid and gpu_instance_id.",
            labels=[*labels, "mig_uuid", "compute_instance_id", "profile", "placement_start", "placement_size"],
        )
        total = GaugeMetricFamily("xpu_mig_memory_total_bytes", "Memory of the MIG instance.", labels=labels)
        used = GaugeMetricFamily("xpu_mig_memory_used_bytes", "Memory in use inside the MIG instance.", labels=labels)
        sms = GaugeMetricFamily(
            "xpu_mig_multiprocessors", "Streaming multiprocessors of the MIG instance.", labels=labels
        )
        for gpu in snapshot.gpus:
            if not gpu.fresh:
                continue
            for inst in gpu.mig_instances:
                values = [*gpu_label_values(gpu), str(inst.gpu_instance_id)]
                info.add_metric(
                    values,
                    {
                        "mig_uuid": inst.uuid,
                        "compute_instance_id": str(inst.compute_instance_id),
                        "profile": inst.profile_name,
                        "placement_start": str(inst.placement_start),
                        "placement_size": str(inst.placement_size),
                    },
                )
                total.add_metric(values, float(inst.memory_total_bytes))
                sms.add_metric(values, float(inst.sm_count))
                if not isinstance(inst.memory_used_bytes, Unsupported):
                    used.add_metric(values, float(inst.memory_used_bytes))
        return (info, total, used, sms)
