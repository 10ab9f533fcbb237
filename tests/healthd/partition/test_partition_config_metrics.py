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
from healthd.daemon.config import ConfigError, parse_config
from healthd.partition.manager import CreateRequest
from healthd.partition.metrics import PartitionCollector
from healthd.partition.model import CardMode, Owner, OwnerKind
from tests.support.partition_node import Node


def test_partitions_section_parses() -> None:
    cfg = parse_config(
        {
            "partitions": {"runtime_dir": "/run/xrk", "reconcile_interval_seconds": 5, "lease_default_seconds": 120},
            "daemon": {"admin_group": "root"},
            "host": {"cdi_dir": "/etc/cdi", "mps_control": "nvidia"},
        }
    )
    p = cfg.partitions
    assert p.runtime_dir == Path("/run/xrk")
    assert p.reconcile_interval_seconds == 5.0
    assert (cfg.host.cdi_dir, cfg.host.mps_control) == (Path("/etc/cdi"), "nvidia")
    assert cfg.daemon.admin_group == "root"
    assert cfg.daemon.admin_socket is None
    assert parse_config({}).partitions.enabled is True


def test_admin_socket_defaults_beside_the_main_socket() -> None:
    cfg = parse_config({"daemon": {"grpc_listen": ["unix:/run/xrk/healthd.sock"]}})
    assert cfg.admin_socket == Path("/run/xrk/healthd-admin.sock")
    cfg = parse_config({"daemon": {"admin_socket": "/run/other/admin.sock"}})
    assert cfg.admin_socket == Path("/run/other/admin.sock")


@pytest.mark.parametrize(
    ("section", "table", "message"),
    [
        ("partitions", {"cdi": "/x"}, "partitions.cdi: unknown option"),
        ("partitions", {"cdi_dir": "/x"}, "partitions.cdi_dir: unknown option"),  # moved to [host]
        ("host", {"cdi_dir": "relative"}, "host.cdi_dir: must be an absolute path"),
        ("host", {"mps_control": "maybe"}, "host.mps_control: must be one of auto, nvidia, simulated"),
        ("partitions", {"reconcile_interval_seconds": 0}, "partitions.reconcile_interval_seconds: must be between"),
        ("partitions", {"enabled": "yes"}, "partitions.enabled: expected true or false"),
        ("daemon", {"admin_group": "no-such-group-xyz"}, "daemon.admin_group: no group named"),
        ("daemon", {"admin_socket": "admin.sock"}, "daemon.admin_socket: must be an absolute path"),
    ],
)
def test_partitions_section_errors(section: str, table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({section: table})


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
    from exporter.backends.call_counters import CallCounters
    from exporter.snapshot import Snapshot

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
