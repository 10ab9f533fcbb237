"""The XID catalog: versioned data (catalog.toml) mapping each XID to a severity and an action.

Config overrides change single XIDs. Application-level XIDs (caused by the program, not the card) are capped at
``Action.RESTART_APP`` after overrides are applied, so no configuration can make them reset, reboot or replace.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from healthd.findings import Action, Severity

SEVERITIES = {s.name.lower(): s for s in Severity}
ACTIONS = {a.label: a for a in Action}


class CatalogError(ValueError):
    """The catalog file or an override is invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class XidEntry:
    xid: int
    name: str
    severity: Severity
    action: Action
    application_level: bool
    description: str
    nvidia_bucket: str = ""
    known: bool = True  # False: not in the catalog, the [unknown] defaults apply

    def capped(self) -> XidEntry:
        if self.application_level and self.action > Action.RESTART_APP:
            return replace(self, action=Action.RESTART_APP)
        return self


@dataclass(frozen=True, slots=True)
class XidOverride:
    severity: Severity | None = None
    action: Action | None = None
    application_level: bool | None = None


class XidCatalog:
    def __init__(self, version: str, entries: Mapping[int, XidEntry], unknown: tuple[Severity, Action]) -> None:
        self.version = version
        self._entries = MappingProxyType({k: v.capped() for k, v in entries.items()})
        self._unknown = unknown

    def __len__(self) -> int:
        return len(self._entries)

    def xids(self) -> tuple[int, ...]:
        return tuple(sorted(self._entries))

    def lookup(self, xid: int) -> XidEntry:
        entry = self._entries.get(xid)
        if entry is not None:
            return entry
        severity, action = self._unknown
        description = f"XID {xid} is not in catalog {self.version}"
        return XidEntry(xid, "UNKNOWN", severity, action, False, description, known=False)

    def with_overrides(self, overrides: Mapping[int, XidOverride]) -> XidCatalog:
        entries = dict(self._entries)
        for xid, o in overrides.items():
            base = entries.get(xid) or self.lookup(xid)
            entries[xid] = replace(
                base,
                severity=base.severity if o.severity is None else o.severity,
                action=base.action if o.action is None else o.action,
                application_level=base.application_level if o.application_level is None else o.application_level,
            )
        return XidCatalog(f"{self.version}+overrides" if overrides else self.version, entries, self._unknown)


def load_catalog(path: Path | None = None, overrides: Mapping[int, XidOverride] | None = None) -> XidCatalog:
    """The built-in catalog (or the file at ``path``) with ``overrides`` applied."""
    if path is None:
        text = resources.files("healthd.xid").joinpath("catalog.toml").read_text()
        source = "built-in XID catalog (healthd/xid/catalog.toml)"
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise CatalogError(f"xid catalog {path}: {exc.strerror or exc}") from None
        source = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{source}: not valid TOML: {exc}") from None
    catalog = parse_catalog(data, source)
    return catalog.with_overrides(overrides) if overrides else catalog


def _enum(value: Any, choices: Mapping[str, Any], where: str) -> Any:
    if not isinstance(value, str) or value not in choices:
        raise CatalogError(f"{where}: must be one of {', '.join(choices)}, got {value!r}")
    return choices[value]


def _xid_key(key: str, where: str) -> int:
    # ASCII digits only ("٣" is a digit to str.isdigit) and short (int() refuses over 4300 digits)
    if not (key.isascii() and key.isdigit() and len(key) <= 5) or not 0 < int(key) < 100000:
        shown = key if key.isascii() and key.isalnum() and len(key) <= 20 else repr(key)[:100]
        raise CatalogError(f"{where}.{shown}: an XID must be a positive integer")
    return int(key)


def parse_catalog(data: Mapping[str, Any], source: str) -> XidCatalog:
    version = data.get("catalog_version")
    if not isinstance(version, str) or not version:
        raise CatalogError(f"{source}: catalog_version: expected a non-empty string")
    unknown = data.get("unknown", {})
    if not isinstance(unknown, dict):
        raise CatalogError(f"{source}: unknown: expected a table")
    unknown_sev = _enum(unknown.get("severity", "warning"), SEVERITIES, f"{source}: unknown.severity")
    unknown_act = _enum(unknown.get("action", "none"), ACTIONS, f"{source}: unknown.action")
    table = data.get("xid", {})
    if not isinstance(table, dict):
        raise CatalogError(f"{source}: xid: expected a table of [xid.N] entries")
    entries: dict[int, XidEntry] = {}
    for key, raw in table.items():
        xid = _xid_key(key, f"{source}: xid")
        where = f"{source}: xid.{xid}"
        if not isinstance(raw, dict):
            raise CatalogError(f"{where}: expected a table")
        name, description = raw.get("name"), raw.get("description", "")
        if not isinstance(name, str) or not name:
            raise CatalogError(f"{where}.name: expected a non-empty string")
        if not isinstance(description, str):
            raise CatalogError(f"{where}.description: expected a string")
        app = raw.get("application_level", False)
        if not isinstance(app, bool):
            raise CatalogError(f"{where}.application_level: expected true or false")
        entries[xid] = XidEntry(
            xid=xid,
            name=name,
            severity=_enum(raw.get("severity"), SEVERITIES, f"{where}.severity"),
            action=_enum(raw.get("action"), ACTIONS, f"{where}.action"),
            application_level=app,
            description=description,
            nvidia_bucket=str(raw.get("nvidia_bucket", "")),
        )
    return XidCatalog(version, entries, (unknown_sev, unknown_act))


def parse_overrides(table: Mapping[str, Any], where: str) -> dict[int, XidOverride]:
    """``{"79": {"action": "replace_node"}, "94": {"severity": "info"}}`` -> overrides; errors name the option."""
    out: dict[int, XidOverride] = {}
    for key, raw in table.items():
        xid = _xid_key(str(key), where)
        here = f"{where}.{xid}"
        if not isinstance(raw, dict):
            raise CatalogError(f"{here}: expected a table with severity, action and/or application_level")
        unknown = sorted(set(raw) - {"severity", "action", "application_level"})
        if unknown:
            name = unknown[0] if unknown[0].isidentifier() else repr(unknown[0])[:100]
            raise CatalogError(f"{here}.{name}: unknown option (known: action, application_level, severity)")
        app = raw.get("application_level")
        if app is not None and not isinstance(app, bool):
            raise CatalogError(f"{here}.application_level: expected true or false")
        out[xid] = XidOverride(
            severity=None if "severity" not in raw else _enum(raw["severity"], SEVERITIES, f"{here}.severity"),
            action=None if "action" not in raw else _enum(raw["action"], ACTIONS, f"{here}.action"),
            application_level=app,
        )
    return out
