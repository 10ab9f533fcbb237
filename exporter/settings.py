"""Settings beside their code: each subsystem declares a frozen dataclass, and one parser reads any of them.

A field's type says what TOML value it takes (bool, int, float, str, Path, ``Path | None``, ``tuple[str, ...]``, or
a nested settings dataclass for a sub-table); its default is the default; ``option(...)`` metadata adds bounds,
choices, "must be absolute" and a check of its own. Types, bounds and defaults are written once, where the code
that uses them lives, and every message names the option (``section.key: ...``).

A settings class is both its TOML table and the configuration its code runs with (the sampler, the topology
refresher, each probe take theirs as is), so nothing translates one class into another. Bounds are checked here,
when a table is read; a class built in code is taken as given, like any dataclass. Knobs that are no option (a
proc root, a state directory, a clock) are constructor arguments of the code, not fields. This module imports
nothing of the project, so ``exporter`` and ``healthd`` declare sections alike.

A settings class may define ``check(self) -> None`` for rules across its fields; it raises ConfigError.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
OPTION = "xpu-runtime-kit.option"  # the metadata key option() sets


class ConfigError(ValueError):
    """A configuration problem; the message starts with the option's name."""


class InvalidKeyError(ValueError):
    """Raised by a ``check`` of a table-valued option: the problem is at one key (named ``option.key``)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


def option(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    choices: tuple[str, ...] = (),
    absolute: bool = False,
    check: Callable[[Any], None] | None = None,
    parse: Callable[[Any, str], Any] | None = None,
    lower: bool = False,
) -> Any:
    """A settings field. ``min``/``max`` are inclusive bounds, ``above`` an exclusive one; ``check`` raises
    ValueError with the reason; ``parse(raw, name)`` reads a value no plain type describes (raising ConfigError);
    ``lower`` lower-cases a string before the choices are checked."""
    meta = {
        OPTION: True, "min": min, "max": max, "above": above, "choices": choices, "absolute": absolute,
        "check": check, "parse": parse, "lower": lower,
    }  # fmt: skip
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def is_option(f: dataclasses.Field[Any]) -> bool:
    """Whether a dataclass field was declared with ``option()`` (a settings class's field)."""
    return bool(f.metadata.get(OPTION))


def known_keys(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls))


def parse_section(cls: type[T], table: Any, where: str) -> T:
    """Read ``table`` (a TOML table) into ``cls``; unknown keys, wrong types and values out of bounds raise
    ConfigError naming ``where.key``."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([{where}])")
    check_keys(table, set(known_keys(cls)), where)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in table:
            values[f.name] = _value(hints[f.name], table[f.name], f.metadata, f"{where}.{f.name}")
    try:
        settings = cls(**values)
    except ValueError as exc:  # a __post_init__ rule
        raise ConfigError(f"{where}: {exc}") from None
    check = getattr(settings, "check", None)
    if callable(check):
        check()
    return settings


def check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed, key=str)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"{prefix}{_shown(str(unknown[0]))}: unknown option (known: {', '.join(sorted(allowed))})")


def _value(hint: Any, raw: Any, meta: Mapping[str, Any], name: str) -> Any:
    custom = meta.get("parse")
    if custom is not None:
        return custom(raw, name)
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0]
    if dataclasses.is_dataclass(hint):
        return parse_section(hint, raw, name)  # type: ignore[arg-type]
    if hint is bool:
        if not isinstance(raw, bool):
            raise ConfigError(f"{name}: expected true or false, got {type(raw).__name__}")
        value: Any = raw
    elif hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"{name}: expected an integer, got {type(raw).__name__}")
        value = _bounded(raw, meta, name)
    elif hint is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ConfigError(f"{name}: expected a number, got {type(raw).__name__}")
        if not math.isfinite(raw):
            raise ConfigError(f"{name}: must be a finite number, got {raw}")
        value = _bounded(float(raw), meta, name)
    elif hint is str:
        value = _string(raw, meta, name)
    elif hint is Path:
        if not isinstance(raw, str):
            raise ConfigError(f"{name}: expected a path (string), got {type(raw).__name__}")
        if optional and raw == "":
            return None
        if meta.get("absolute") and not raw.startswith("/"):
            raise ConfigError(f"{name}: must be an absolute path, got {raw[:200]!r}")
        value = Path(raw)
    elif hint == tuple[tuple[str, str], ...]:  # a table of names to strings, e.g. network levels
        if not isinstance(raw, dict):
            raise ConfigError(f"{name}: expected a table of names to strings ([{name}])")
        for key, item in raw.items():
            if not isinstance(item, str):
                raise ConfigError(f"{name}.{_shown(key)}: expected a string, got {type(item).__name__}")
        value = tuple(sorted((str(k), v) for k, v in raw.items()))
    elif typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (str,):
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not all(isinstance(a, str) for a in items):
            raise ConfigError(f"{name}: expected a string or a list of strings")
        value = tuple(items)
    else:  # a settings class with a field of a type this parser does not know: a bug, not a user error
        raise TypeError(f"{name}: no parser for {hint!r}")
    check = meta.get("check")
    if check is not None:
        try:
            check(value)
        except InvalidKeyError as exc:
            raise ConfigError(f"{name}.{_shown(exc.key)}: {exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return value


def _string(raw: Any, meta: Mapping[str, Any], name: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"{name}: expected a string, got {type(raw).__name__}")
    value = raw.lower() if meta.get("lower") else raw
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        raise ConfigError(f"{name}: must be one of {', '.join(choices)}, got {value[:100]!r}")
    return value


def _bounded(value: float, meta: Mapping[str, Any], name: str) -> Any:
    above = meta.get("above")
    if above is not None and not value > above:
        raise ConfigError(f"{name}: must be > {above:g}, got {value:g}")
    low, high = meta.get("min"), meta.get("max")
    if (low is None or value >= low) and (high is None or value <= high):
        return value
    if low is not None and high is not None:
        raise ConfigError(f"{name}: must be between {low:g} and {high:g}, got {value:g}")
    bound = f"at least {low:g}" if low is not None else f"at most {high:g}"
    raise ConfigError(f"{name}: must be {bound}, got {value:g}")


def _shown(key: str) -> str:
    """A key as a message shows it: quoted (and cut) when it is not a plain name, so the message stays one line."""
    return key if key.isidentifier() else repr(key[:100])
