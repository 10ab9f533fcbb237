"""Health probes: one module per check, each a plain object with ``name`` and ``evaluate(snapshot, now)``.

``PROBES`` is the registry. A probe module exports ``SECTION`` (its ``[health.<section>]`` table), ``Settings`` (a
settings dataclass, read by exporter/settings.py) and ``build(settings, host)``; adding a probe is one file plus one
line here. On a simulated node the host's /proc and /sys describe the machine the simulator runs on, not the
simulated GPUs, so the probe host gives those probes nothing to read there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from exporter.settings import ConfigError, check_keys, parse_section
from healthd.host.view import ProbeHost
from healthd.probes import configuration, driver, ecc, lost_cards, memory_leak, nvlink, pcie, throttle
from healthd.probes.base import Probe
from healthd.xid.watcher import XID_SECTION, XidSettings

PROBES: tuple[ModuleType, ...] = (
    ecc,
    nvlink,
    memory_leak,
    driver,
    lost_cards,
    configuration,
    throttle,
    pcie,
)


def _defaults() -> Mapping[str, Any]:
    return MappingProxyType({m.SECTION: m.Settings() for m in PROBES})


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """[health]: one sub-table per registered probe, and [health.xid] for the XID watcher."""

    probes: Mapping[str, Any] = field(default_factory=_defaults)  # section -> that probe's Settings
    xid: XidSettings = field(default_factory=XidSettings)

    def probe(self, section: str) -> Any:
        return self.probes[section]


def parse_health(table: Any, where: str = "health") -> HealthSettings:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([{where}])")
    check_keys(table, {m.SECTION for m in PROBES} | {XID_SECTION}, where)
    probes = {m.SECTION: parse_section(m.Settings, table.get(m.SECTION, {}), f"{where}.{m.SECTION}") for m in PROBES}
    xid = parse_section(XidSettings, table.get(XID_SECTION, {}), f"{where}.{XID_SECTION}")
    return HealthSettings(probes=MappingProxyType(probes), xid=xid)


def default_probes(settings: HealthSettings, host: ProbeHost) -> list[Probe]:
    return [m.build(settings.probe(m.SECTION), host) for m in PROBES]


__all__ = ["PROBES", "HealthSettings", "Probe", "ProbeHost", "default_probes", "parse_health"]
