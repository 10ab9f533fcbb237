"""A partitions component over any backend, built as the daemon builds it (for tests that need no whole daemon)."""

from __future__ import annotations

from pathlib import Path

from exporter.backends.protocol import Backend
from healthd.daemon.config import Config
from healthd.host.view import HostSettings
from healthd.partition import component
from healthd.partition.component import PartitionsComponent
from healthd.partition.settings import PartitionSettings
from tests.support.node import node_on


def partitions_on(
    backend: Backend,
    state_dir: Path,
    settings: PartitionSettings | None = None,
    *,
    host: HostSettings | None = None,
    runtime_dir: Path | None = None,
) -> PartitionsComponent:
    """``backend`` behind its device lanes; the host view chosen for it (simulated files under ``state_dir``)."""
    config = Config(host=host or HostSettings(), partitions=settings or PartitionSettings())
    built = component.build(node_on(backend, state_dir, config, runtime_dir=runtime_dir))
    assert built is not None
    return built
