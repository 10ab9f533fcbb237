"""The ``[health]`` config section for the probes: parsed and validated here, plugged into healthd/config.py.

Every message starts with the option's path (``health.ecc.correctable_rate_per_hour: must be > 0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from exporter.backends.types import ComputeMode
from healthd.probes.configuration import ConfigurationExpectations
from healthd.probes.ecc import EccThresholds
from healthd.probes.memory_leak import MemoryLeakThresholds
from healthd.probes.nvlink import NvLinkThresholds
from healthd.probes.pcie import PcieThresholds
from healthd.probes.throttle import ThrottleThresholds
from healthd.xid.catalog import CatalogError, XidOverride, parse_overrides
from healthd.xid.watcher import XidSettings

MIB = 2**20


def _fail(message: str) -> NoReturn:
    # imported here, not at the top: healthd/config.py imports this module to build its Config
    from healthd.config import ConfigError

    raise ConfigError(message)


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    proc_root: Path = Path("/proc")
    sysfs_root: Path = Path("/sys")
    kmsg_path: Path | None = Path("/dev/kmsg")  # None: no kernel-log source ("" in the file)
    expected_gpus: int | None = None  # None: learned at first start
    hang_after_seconds: float = 300.0
    dstate_after_seconds: float = 300.0
    ecc: EccThresholds = field(default_factory=EccThresholds)
    nvlink: NvLinkThresholds = field(default_factory=NvLinkThresholds)
    memory_leak: MemoryLeakThresholds = field(default_factory=MemoryLeakThresholds)
    configuration: ConfigurationExpectations = field(default_factory=ConfigurationExpectations)
    clocks: ThrottleThresholds = field(default_factory=ThrottleThresholds)
    pcie: PcieThresholds = field(default_factory=PcieThresholds)
    xid: XidSettings = field(default_factory=XidSettings)
    xid_overrides: Mapping[int, XidOverride] = field(default_factory=dict)


_SECTIONS = {"ecc", "nvlink", "memory_leak", "driver", "lost_cards", "configuration", "clocks", "pcie", "xid"}
_TOP = {"proc_root", "sysfs_root", "kmsg_path"} | _SECTIONS


def _key_name(key: str) -> str:
    """A key as the message shows it: quoted when it is not a plain name (a line break must not split the line)."""
    return key if key.isidentifier() else repr(key)[:100]


def _table(parent: Mapping[str, Any], key: str, where: str, allowed: set[str]) -> Mapping[str, Any]:
    value = parent.get(key, {})
    if not isinstance(value, dict):
        _fail(f"{where}.{key}: expected a table ([{where}.{key}])")
    unknown = sorted(set(value) - allowed)
    if unknown:
        _fail(f"{where}.{key}.{_key_name(unknown[0])}: unknown option (known: {', '.join(sorted(allowed))})")
    return value


def _num(t: Mapping[str, Any], key: str, where: str, default: float, *, above: float | None = None,
         at_least: float | None = None, at_most: float | None = None) -> float:  # fmt: skip
    value = t.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(f"{where}.{key}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        _fail(f"{where}.{key}: must be a finite number, got {value}")
    if above is not None and not value > above:
        _fail(f"{where}.{key}: must be > {above:g}, got {value}")
    if at_least is not None and value < at_least:
        _fail(f"{where}.{key}: must be >= {at_least:g}, got {value}")
    if at_most is not None and value > at_most:
        _fail(f"{where}.{key}: must be <= {at_most:g}, got {value}")
    return float(value)


def _int(t: Mapping[str, Any], key: str, where: str, default: int, *, at_least: int) -> int:
    value = t.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(f"{where}.{key}: expected an integer, got {type(value).__name__}")
    if value < at_least:
        _fail(f"{where}.{key}: must be >= {at_least}, got {value}")
    return value


def _path(t: Mapping[str, Any], key: str, where: str, default: Path) -> Path:
    value = t.get(key, str(default))
    if not isinstance(value, str) or not value.startswith("/"):
        _fail(f"{where}.{key}: expected an absolute path, got {value!r}")
    return Path(value)


def _choice(t: Mapping[str, Any], key: str, where: str, default: str, choices: Mapping[str, Any]) -> Any:
    value = t.get(key, default)
    if not isinstance(value, str) or value not in choices:
        _fail(f"{where}.{key}: must be one of {', '.join(choices)}, got {value!r}")
    return choices[value]


def parse_probe_settings(table: Mapping[str, Any], where: str = "health") -> ProbeSettings:
    unknown = sorted(set(table) - _TOP)
    if unknown:
        _fail(f"{where}.{_key_name(unknown[0])}: unknown option (known: {', '.join(sorted(_TOP))})")
    d = ProbeSettings()
    kmsg_raw = table.get("kmsg_path", str(d.kmsg_path))
    if kmsg_raw == "":
        kmsg: Path | None = None
    else:
        kmsg = _path(table, "kmsg_path", where, Path("/dev/kmsg"))

    w = f"{where}.ecc"
    t = _table(
        table, "ecc", where, {"correctable_rate_per_hour", "correctable_window_seconds", "uncorrectable_remap_warn"}
    )
    ecc = EccThresholds(
        correctable_rate_per_hour=_num(t, "correctable_rate_per_hour", w, d.ecc.correctable_rate_per_hour, above=0),
        correctable_window_seconds=_num(t, "correctable_window_seconds", w, d.ecc.correctable_window_seconds, above=0),
        uncorrectable_remap_warn=_int(t, "uncorrectable_remap_warn", w, d.ecc.uncorrectable_remap_warn, at_least=1),
    )

    w = f"{where}.nvlink"
    t = _table(table, "nvlink", where, {"crc_per_second_fail", "error_hold_seconds"})
    nvlink = NvLinkThresholds(
        crc_per_second_fail=_num(t, "crc_per_second_fail", w, d.nvlink.crc_per_second_fail, above=0),
        error_hold_seconds=_num(t, "error_hold_seconds", w, d.nvlink.error_hold_seconds, above=0),
    )

    w = f"{where}.memory_leak"
    m = d.memory_leak
    t = _table(
        table,
        "memory_leak",
        where,
        {"orphan_min_mib", "orphan_samples", "gone_samples", "growth_window_seconds", "growth_min_mib"},
    )
    leak = MemoryLeakThresholds(
        orphan_min_bytes=_int(t, "orphan_min_mib", w, m.orphan_min_bytes // MIB, at_least=1) * MIB,
        orphan_samples=_int(t, "orphan_samples", w, m.orphan_samples, at_least=1),
        gone_samples=_int(t, "gone_samples", w, m.gone_samples, at_least=1),
        growth_window_seconds=_num(t, "growth_window_seconds", w, m.growth_window_seconds, above=0),
        growth_min_bytes=_int(t, "growth_min_mib", w, m.growth_min_bytes // MIB, at_least=1) * MIB,
    )

    w = f"{where}.driver"
    t = _table(table, "driver", where, {"hang_after_seconds", "dstate_after_seconds"})
    hang = _num(t, "hang_after_seconds", w, d.hang_after_seconds, above=0)
    dstate = _num(t, "dstate_after_seconds", w, d.dstate_after_seconds, above=0)

    w = f"{where}.lost_cards"
    t = _table(table, "lost_cards", where, {"expected_gpus"})
    expected = None if "expected_gpus" not in t else _int(t, "expected_gpus", w, 0, at_least=1)

    w = f"{where}.configuration"
    t = _table(table, "configuration", where, {"compute_mode", "persistence_mode", "ecc", "pending_grace_seconds"})
    modes: dict[str, ComputeMode | None] = {m.name.lower(): m for m in ComputeMode}
    modes["any"] = None
    configuration = ConfigurationExpectations(
        compute_mode=_choice(t, "compute_mode", w, "default", modes),
        persistence_mode=_choice(t, "persistence_mode", w, "on", {"on": True, "off": False, "any": None}),
        ecc_enabled=_choice(t, "ecc", w, "enabled", {"enabled": True, "disabled": False, "any": None}),
        pending_grace_seconds=_num(t, "pending_grace_seconds", w, 300.0, at_least=0),
    )

    w = f"{where}.clocks"
    t = _table(table, "clocks", where, {"window_seconds", "active_ratio"})
    clocks = ThrottleThresholds(
        window_seconds=_num(t, "window_seconds", w, d.clocks.window_seconds, above=0),
        active_ratio=_num(t, "active_ratio", w, d.clocks.active_ratio, above=0, at_most=1),
    )

    w = f"{where}.pcie"
    t = _table(table, "pcie", where, {"consecutive_samples"})
    pcie = PcieThresholds(consecutive_samples=_int(t, "consecutive_samples", w, d.pcie.consecutive_samples, at_least=1))

    w = f"{where}.xid"
    t = _table(table, "xid", where, {"merge_window_seconds", "overrides"})
    xid = XidSettings(merge_window_seconds=_num(t, "merge_window_seconds", w, d.xid.merge_window_seconds, above=0))
    raw_overrides = t.get("overrides", {})
    if not isinstance(raw_overrides, dict):
        _fail(f"{w}.overrides: expected a table of [{w}.overrides.N] entries")
    try:
        overrides = parse_overrides(raw_overrides, f"{w}.overrides")
    except CatalogError as exc:
        _fail(str(exc))

    return ProbeSettings(
        proc_root=_path(table, "proc_root", where, d.proc_root),
        sysfs_root=_path(table, "sysfs_root", where, d.sysfs_root),
        kmsg_path=kmsg,
        expected_gpus=expected,
        hang_after_seconds=hang,
        dstate_after_seconds=dstate,
        ecc=ecc,
        nvlink=nvlink,
        memory_leak=leak,
        configuration=configuration,
        clocks=clocks,
        pcie=pcie,
        xid=xid,
        xid_overrides=overrides,
    )
