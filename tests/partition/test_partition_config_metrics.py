"""The [partitions] config section and the partition metrics (checked with promtool)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.collectors import SnapshotExporter
from healthd.config import ConfigError, parse_config
from healthd.partition.manager import CreateRequest
from healthd.partition.metrics import PartitionCollector
from healthd.partition.model import CardMode, Owner, OwnerKind
from tests.partition.conftest import Node


def test_partitions_section_parses() -> None:
    cfg = parse_config(
        {
            "partitions": {
                "cdi_dir": "/etc/cdi",
                "runtime_dir": "/run/xrk",
                "admin_group": "root",
                "mps": "nvidia",
                "reconcile_interval_seconds": 5,
                "lease_default_seconds": 120,
            }
        }
    )
    p = cfg.partitions
    assert (p.cdi_dir, p.runtime_dir) == (Path("/etc/cdi"), Path("/run/xrk"))
    assert (p.admin_group, p.mps) == ("root", "nvidia")
    assert p.reconcile_interval_seconds == 5.0
    assert p.admin_socket is None
    assert parse_config({}).partitions.enabled is True


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"cdi": "/x"}, "partitions.cdi: unknown option"),
        ({"cdi_dir": "relative"}, "partitions.cdi_dir: must be an absolute path"),
        ({"mps": "maybe"}, "partitions.mps: must be auto, nvidia or simulated"),
        ({"reconcile_interval_seconds": 0}, "partitions.reconcile_interval_seconds: must be between"),
        ({"enabled": "yes"}, "partitions.enabled: expected true or false"),
        ({"admin_group": "no-such-group-xyz"}, "partitions.admin_group: no group named"),
    ],
)
def test_partitions_section_errors(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"partitions": table})


def test_metrics_exposition_is_valid(make_node: Callable[[str], Node], tmp_path: Path) -> None:
    async def go() -> Node:
        node = make_node("h200x8")
        m = node.manager()
        await m.start()
        await m.set_mode("1", CardMode.TDM)
        await m.set_mode("6", CardMode.MIG)
        await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="h"), "1", 25, 8192))
        await m.create(CreateRequest(Owner(OwnerKind.LEASE, holder="h"), "6", 10, 0))
        registry = CollectorRegistry(auto_describe=False)
        collector = PartitionCollector(m.view, lambda: m.reclaimed_total)
        registry.register(SnapshotExporter(lambda: _snapshot(), [collector]))
        text = generate_latest(registry).decode()
        (tmp_path / "metrics.txt").write_text(text)
        assert 'xpu_partition_compute_quota_ratio{gpu="1"' in text
        assert "0.25" in text
        assert 'xpu_gpu_partition_mode{gpu="6",mode="mig"' in text
        assert 'mig_profile="1g.18gb"' in text
        assert 'xpu_gpu_partition_compute_allocated_ratio{gpu="1"' in text
        assert 'xpu_gpu_foreign_mig_instances{gpu="7"' in text
        return node

    asyncio.run(go())
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=(tmp_path / "metrics.txt").read_text(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _snapshot() -> object:
    from exporter.snapshot import CallCounters, Snapshot

    return Snapshot(
        seq=1,
        taken_at=0.0,
        interval_seconds=5.0,
        cycle_seconds=0.0,
        backend_name="simulated",
        backend_up=True,
        backend_error=None,
        system=None,
        gpus=(),
        counters=CallCounters(),
    )
