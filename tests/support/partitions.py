"""A partitions component over any backend, wired as the daemon wires it (for tests that need no whole daemon)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.sampler import SamplerSettings
from healthd.host.view import HostSettings, choose_host
from healthd.partition.component import PartitionsComponent
from healthd.partition.settings import PartitionSettings


def partitions_on(
    backend: Backend,
    state_dir: Path,
    settings: PartitionSettings | None = None,
    *,
    host: HostSettings | None = None,
    runtime_dir: Path | None = None,
    **kwargs: Any,
) -> PartitionsComponent:
    """``backend`` behind its device lanes; the host view chosen for it (simulated files under ``state_dir``)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    device = GuardedBackend(DeviceAccess(backend, SamplerSettings()))
    view = choose_host(host or HostSettings(), backend, state_dir)
    return PartitionsComponent(
        settings or PartitionSettings(),
        device,
        view,
        state_dir,
        runtime_dir=runtime_dir or state_dir.parent / "run",
        **kwargs,
    )
