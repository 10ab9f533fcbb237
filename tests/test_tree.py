"""tests/ mirrors the code: tests/exporter/, tests/healthd/ and tests/container/ have a directory only where the
source has that package, and none holds an ``__init__.py`` (under importlib mode a test package named like a source
package, such as tests/healthd/partition/, would shadow it)."""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import REPO, TESTS

MIRRORED = ("exporter", "healthd", "container")


def mirror_directories() -> list[Path]:
    return sorted(
        d
        for top in MIRRORED
        for d in [TESTS / top, *(TESTS / top).rglob("*")]
        if d.is_dir() and d.name != "__pycache__"
    )


def test_every_test_directory_is_a_source_package() -> None:
    missing = [
        str(d.relative_to(REPO))
        for d in mirror_directories()
        if not (REPO / d.relative_to(TESTS) / "__init__.py").is_file()
    ]
    assert missing == []


def test_no_test_directory_is_a_package() -> None:
    assert [str(d.relative_to(REPO)) for d in mirror_directories() if (d / "__init__.py").exists()] == []
