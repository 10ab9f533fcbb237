"""SIGHUP: which settings a running daemon can take over, and which need a restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from healthd.daemon.config import Config
from healthd.xid.watcher import XID_SECTION

# Options applied in place on SIGHUP. The web config file is also re-read when its path did not change, so
# rotated certificates and new basic-auth users take effect.
RELOADABLE = frozenset({"daemon.log_level", "transport.metrics_web_config_file"})


def flatten(config: Config) -> dict[str, Any]:
    """Option name as written in the TOML file (``health.ecc.enabled``) -> value."""
    out: dict[str, Any] = {}
    for name, value in _toml_shaped(config).items():
        _flatten_into(out, name, value)
    return out


def _toml_shaped(config: Config) -> dict[str, Any]:
    """Each section; [health] as parse_config reads it: a table per probe and [health.xid]."""
    sections: dict[str, Any] = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "source"}
    sections["health"] = {**config.health.probes, XID_SECTION: config.health.xid}
    return sections


def _flatten_into(out: dict[str, Any], prefix: str, value: Any) -> None:
    if is_dataclass(value) and not isinstance(value, type):
        for inner in fields(value):
            _flatten_into(out, f"{prefix}.{inner.name}", getattr(value, inner.name))
    elif isinstance(value, Mapping):
        for key, inner_value in value.items():
            _flatten_into(out, f"{prefix}.{key}", inner_value)
    else:
        out[prefix] = value


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    applied: tuple[str, ...]  # changed and taken over now
    needs_restart: tuple[str, ...]  # changed, ignored until the daemon restarts
    config: Config  # the running config with the reloadable options taken from the new one


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    old_flat, new_flat = flatten(running), flatten(new)
    changed = sorted(k for k in new_flat if old_flat.get(k) != new_flat[k])
    applied = tuple(k for k in changed if k in RELOADABLE)
    restart = tuple(k for k in changed if k not in RELOADABLE)
    merged = replace(
        running,
        daemon=replace(running.daemon, log_level=new.log_level),
        transport=replace(running.transport, metrics_web_config_file=new.transport.metrics_web_config_file),
    )
    return ReloadPlan(applied, restart, merged)
