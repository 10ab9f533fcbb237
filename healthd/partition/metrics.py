"""Partition metrics from the manager's published view (a scrape never touches the GPU, MPS or the store)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.snapshot import Snapshot
from healthd.partition.manager import View
from healthd.partition.model import CardMode
from healthd.partition.quantity import MIB
from healthd.partition.sharing import SharingPolicy


class PartitionCollector:
    """Collector protocol object (name + collect(snapshot, now)); the snapshot is not needed."""

    name = "partitions"

    def __init__(
        self,
        view: Callable[[], View],
        reclaimed_total: Callable[[], int],
        reconcile_failures: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._view = view
        self._reclaimed = reclaimed_total
        self._reconcile_failures = reconcile_failures

    def collect(self, snapshot: Snapshot, now: float) -> Iterable[Metric]:
        view = self._view()
        labels = ["partition_id", "gpu", "uuid"]
        info = InfoMetricFamily(
            "xpu_partition",
            "A GPU partition: its card, mode, owner kind, state and (MIG) device.",
            labels=[*labels, "mode", "owner_kind", "state", "cdi_device", "mig_profile", "mig_uuid"],
        )
        compute = GaugeMetricFamily(
            "xpu_partition_compute_quota_ratio",
            "Compute quota of the partition as a share of one card (0-1); absent when unlimited.",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "xpu_partition_memory_limit_bytes",
            "Memory cap of the partition (MIG: the instance's memory); absent when unlimited.",
            labels=labels,
        )
        for p in view.partitions:
            values = [p.id, str(p.gpu), p.gpu_uuid]
            info.add_metric(
                values,
                {
                    "mode": p.mode.value,
                    "owner_kind": p.owner.kind.value,
                    "state": p.state.value,
                    "cdi_device": f"xpu-runtime-kit.io/gpu={p.id}",
                    "mig_profile": p.mig.profile_name if p.mig else "",
                    "mig_uuid": p.mig.uuid if p.mig else "",
                },
            )
            if p.compute_percent:
                compute.add_metric(values, p.compute_percent / 100.0)
            if p.memory_mib:
                memory.add_metric(values, float(p.memory_mib * MIB))
        mode = GaugeMetricFamily(
            "xpu_gpu_partition_mode",
            "Partition mode of the card (1 for the current mode).",
            labels=["gpu", "uuid", "mode"],
        )
        sharing = GaugeMetricFamily(
            "xpu_gpu_partition_sharing",
            "TDM sharing policy of the card (1 for the current one): isolated (an MPS daemon per partition, quotas "
            "enforced) or shared (one per card, partitions side by side, quotas cooperative).",
            labels=["gpu", "uuid", "policy"],
        )
        count = GaugeMetricFamily("xpu_gpu_partitions", "Partitions on the card.", labels=["gpu", "uuid"])
        alloc_compute = GaugeMetricFamily(
            "xpu_gpu_partition_compute_allocated_ratio",
            "Compute allocated to partitions as a share of the card (TDM: quota sum; MIG: SMs of our instances).",
            labels=["gpu", "uuid"],
        )
        alloc_memory = GaugeMetricFamily(
            "xpu_gpu_partition_memory_allocated_bytes",
            "Memory allocated to partitions on the card (TDM: sum of caps; MIG: memory of our instances).",
            labels=["gpu", "uuid"],
        )
        foreign = GaugeMetricFamily(
            "xpu_gpu_foreign_mig_instances",
            "MIG instances on the card that this daemon did not create (left alone).",
            labels=["gpu", "uuid"],
        )
        for c in view.cards:
            card = [str(c.gpu), c.gpu_uuid]
            for m in CardMode:
                mode.add_metric([*card, m.value], 1.0 if c.mode is m else 0.0)
            if c.sharing:
                for policy in SharingPolicy:
                    sharing.add_metric([*card, policy.value], 1.0 if c.sharing == policy.value else 0.0)
            count.add_metric(card, float(c.partitions))
            alloc_compute.add_metric(card, c.compute_percent_allocated / 100.0)
            alloc_memory.add_metric(card, float(c.memory_allocated_mib * MIB))
            foreign.add_metric(card, float(len(c.foreign)))
        reclaimed = CounterMetricFamily(
            "xpu_partitions_reclaimed", "Partitions reclaimed because their owner was gone.", value=self._reclaimed()
        )
        failures = CounterMetricFamily(
            "xpu_partition_reconcile_failures",
            "Reconcile passes that failed on one card (e.g. hung) or on MPS; the other cards are reconciled anyway.",
            labels=["scope"],
        )
        for scope, n in sorted(self._reconcile_failures().items()):
            failures.add_metric([scope], float(n))
        return [info, compute, memory, mode, sharing, count, alloc_compute, alloc_memory, foreign, reclaimed, failures]
