"""The daemon's state as rows for the status page (exporter/status_page.py renders them; it never imports healthd)."""

from __future__ import annotations

from exporter.status_page import CheckRow, FaultRow, PartitionRow, StatusProviders
from healthd.faults.engine import FaultEngine
from healthd.partition.manager import PartitionManager


def status_providers(engine: FaultEngine, partitions: PartitionManager | None) -> StatusProviders:
    def checks() -> list[CheckRow]:
        return [
            CheckRow(
                check=s.result.check,
                gpu=s.result.gpu.index if s.result.gpu else None,
                status=str(s.result.status),
                detail=s.result.detail,
            )
            for s in engine.check_states()
        ]

    def faults() -> list[FaultRow]:
        return [
            FaultRow(
                code=f.code,
                gpu=f.gpu.index if f.gpu else None,
                severity=f.severity.name.lower(),
                action=f.action.label,
                message=f.message,
                since=f.first_seen,
            )
            for f in engine.active_faults()
        ]

    def partition_rows() -> list[PartitionRow]:
        if partitions is None:
            return []
        rows = []
        for p in partitions.view().partitions:
            if p.mig is not None:
                detail = f"MIG {p.mig.profile_name} at slice {p.mig.placement_start}"
            else:
                compute = f"{p.compute_percent}%" if p.compute_percent else "no compute limit"
                detail = f"{compute}, {p.memory_mib} MiB" if p.memory_mib else compute
            rows.append(PartitionRow(p.id, p.gpu, str(p.mode), p.owner.describe(), detail))
        return rows

    return StatusProviders(checks=checks, faults=faults, partitions=partition_rows)
