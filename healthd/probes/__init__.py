"""Health probes: one module per check, each a plain object with ``name`` and ``evaluate(snapshot, now)``.

``default_probes`` is the registry (one line per probe). On a simulated node the host's /proc and /sys describe
the machine the simulator runs on, not the simulated GPUs, so the checks that read them are off there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from exporter.backends.protocol import Backend
from exporter.snapshot import Snapshot
from healthd.probes.base import Probe
from healthd.probes.config import ProbeSettings
from healthd.probes.configuration import ConfigurationProbe
from healthd.probes.driver import DriverProbe, DriverSettings
from healthd.probes.ecc import EccProbe
from healthd.probes.lost_cards import LostCardProbe, LostCardSettings
from healthd.probes.memory_leak import MemoryLeakProbe, MemoryLeakSettings
from healthd.probes.nvlink import NvLinkProbe
from healthd.probes.pcie import PcieProbe
from healthd.probes.throttle import ThrottleProbe
from healthd.xid.catalog import load_catalog
from healthd.xid.watcher import EventSink, XidWatcher


def default_probes(settings: ProbeSettings, *, state_dir: Path | None, simulated: bool) -> list[Probe]:
    proc = None if simulated else settings.proc_root
    sysfs = None if simulated else settings.sysfs_root
    return [
        EccProbe(settings.ecc),
        NvLinkProbe(settings.nvlink),
        MemoryLeakProbe(MemoryLeakSettings(proc_root=proc, thresholds=settings.memory_leak)),
        DriverProbe(DriverSettings(proc, settings.hang_after_seconds, settings.dstate_after_seconds)),
        LostCardProbe(LostCardSettings(settings.expected_gpus, state_dir, sysfs)),
        ConfigurationProbe(settings.configuration),
        ThrottleProbe(settings.clocks),
        PcieProbe(settings.pcie),
    ]


def xid_watcher(
    settings: ProbeSettings,
    backend: Backend,
    sink: EventSink,
    snapshots: Callable[[], Snapshot | None],
    *,
    simulated: bool,
    clock: Callable[[], float] = time.time,
) -> XidWatcher:
    """The XID watcher with the catalog and config overrides; no kernel log on a simulated node by default."""
    kmsg = None if simulated and settings.kmsg_path == Path("/dev/kmsg") else settings.kmsg_path
    catalog = load_catalog(overrides=settings.xid_overrides)
    return XidWatcher(backend, kmsg, catalog, sink, clock, snapshots, settings.xid)


__all__ = ["Probe", "ProbeSettings", "default_probes", "xid_watcher"]
