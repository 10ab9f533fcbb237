"""[partitions]: whether partitions are served, where MPS pipes go, how often owners are checked, CDI contents."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exporter.settings import option

LEASE_MAX_SECONDS = 86400.0  # the longest lease a client may ask for, and the longest default


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """[partitions]; the partition manager runs on it as read."""

    enabled: bool = True
    # MPS pipe and log directories live under <runtime_dir>/mps/<id>/; unset: the main gRPC socket's directory
    runtime_dir: Path | None = option(None, absolute=True)
    reconcile_interval_seconds: float = option(10.0, min=0.1, max=3600)
    lease_default_seconds: float = option(300.0, min=1, max=LEASE_MAX_SECONDS)
    owner_grace_seconds: float = option(60.0, min=0, max=3600)  # before a missing owner's partitions go
    # auto: the driver's libraries and binaries (found through the ld.so cache) go into every CDI device, with an
    # ldcache hook; off: the operator relies on nvidia-container-toolkit for them. Never on a simulated node.
    cdi_driver_libraries: str = option("auto", choices=("auto", "off"))
    tdm_sharing: str = option("isolated", choices=("isolated", "shared"))  # docs/partitioning.md, "Sharing a card"
