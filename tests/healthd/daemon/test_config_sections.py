"""Every TOML section is one class: the settings class a subsystem declares is both its table and the configuration
it runs with, so no second class keeps the same defaults and bounds beside it.

Three rules, over every dataclass in exporter/ and healthd/: a class is the section of one table only; a class with
``option()`` fields is a table of the daemon's file (nothing declares options that no file can set); and no other
dataclass repeats a section's default under the same name (the mark of a twin class that the code runs on while the
file fills the other; flags such as ``enabled = True`` are too common to mean one and are left out).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from exporter.settings import is_option
from healthd.daemon.config import Config
from tests.support.paths import REPO

PACKAGES = ("exporter", "healthd")


def tables(value: object, where: str) -> Iterator[tuple[str, type]]:
    """(TOML path, class) of every table under the settings ``value``, sub-tables and probe tables included."""
    for f in dataclasses.fields(value):  # type: ignore[arg-type]
        item = getattr(value, f.name)
        path = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            yield path, type(item)
            yield from tables(item, path)
        elif isinstance(item, Mapping):  # [health]: one table per registered probe, named by its section
            for key, sub in item.items():
                if dataclasses.is_dataclass(sub) and not isinstance(sub, type):
                    yield f"{where}.{key}", type(sub)
                    yield from tables(sub, f"{where}.{key}")


def section_classes() -> dict[type, list[str]]:
    found: dict[type, list[str]] = {}
    for path, cls in tables(Config(), ""):
        found.setdefault(cls, []).append(path)
    return found


def project_dataclasses() -> list[type]:
    out: list[type] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or path.name == "__main__.py":
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = importlib.import_module(".".join(parts))
            out += [
                c
                for _, c in inspect.getmembers(module, inspect.isclass)
                if dataclasses.is_dataclass(c) and c.__module__ == module.__name__
            ]
    return out


def defaults(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


SECTIONS = section_classes()
CLASSES = project_dataclasses()


def test_the_walk_sees_every_kind_of_table() -> None:
    paths = {p for ps in SECTIONS.values() for p in ps}
    assert {"daemon", "sampler", "topology", "partitions", "health.ecc", "health.nvlink", "health.xid"} <= paths
    assert len(CLASSES) > 50


def test_no_class_is_two_tables() -> None:
    assert {cls.__qualname__: paths for cls, paths in SECTIONS.items() if len(paths) > 1} == {}


def test_every_class_with_options_is_a_table_of_the_file() -> None:
    stray = [
        f"{c.__module__}.{c.__qualname__}"
        for c in CLASSES
        if c not in SECTIONS and any(is_option(f) for f in dataclasses.fields(c))
    ]
    assert stray == []


def test_no_other_class_repeats_a_tables_defaults() -> None:
    twins: list[str] = []
    for section, paths in SECTIONS.items():
        wanted = defaults(section)
        for c in CLASSES:
            if c in SECTIONS:
                continue
            same = sorted(
                k for k, v in defaults(c).items() if k in wanted and wanted[k] == v and not isinstance(v, bool)
            )
            if same:
                twins.append(f"{c.__module__}.{c.__qualname__} repeats [{paths[0]}] {', '.join(same)}")
    assert twins == []
