"""Per-MIG-instance metrics: identity, size and memory in use, for cards with MIG on."""

from __future__ import annotations

from exporter.backends.types import Unsupported
from exporter.collectors.base import GPU_LABELS, gpu_labels
from exporter.collectors.series import INFO, Exposer, Family, SeriesCollector
from exporter.snapshot import Snapshot

MIG_LABELS = (*GPU_LABELS, "gpu_instance_id")

MIG_INFO = Family(
    "xpu_mig_instance",
    "A MIG device (GPU instance and its compute instance); join on uuid and gpu_instance_id.",
    INFO,
    (*MIG_LABELS, "mig_uuid", "compute_instance_id", "profile", "placement_start", "placement_size"),
)
TOTAL = Family("xpu_mig_memory_total_bytes", "Memory of the MIG instance.", labels=MIG_LABELS)
USED = Family("xpu_mig_memory_used_bytes", "Memory in use inside the MIG instance.", labels=MIG_LABELS)
SMS = Family("xpu_mig_multiprocessors", "Streaming multiprocessors of the MIG instance.", labels=MIG_LABELS)


class MigCollector(SeriesCollector):
    """One block per card, kept while the card's MIG instances are unchanged."""

    name = "mig"

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(MIG_INFO, TOTAL, USED, SMS)
        for gpu in snapshot.gpus:
            if not gpu.fresh or not gpu.mig_instances:
                continue
            labels = gpu_labels(gpu)
            rows = out.block(gpu.index, (labels, gpu.mig_instances))
            if rows is None:
                continue
            for inst in gpu.mig_instances:
                values = (*labels, str(inst.gpu_instance_id))
                info = (
                    inst.uuid,
                    str(inst.compute_instance_id),
                    inst.profile_name,
                    str(inst.placement_start),
                    str(inst.placement_size),
                )
                rows.add(MIG_INFO, (*values, *info), 1.0)
                rows.add(TOTAL, values, float(inst.memory_total_bytes))
                rows.add(SMS, values, float(inst.sm_count))
                if not isinstance(inst.memory_used_bytes, Unsupported):
                    rows.add(USED, values, float(inst.memory_used_bytes))
