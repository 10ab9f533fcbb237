"""tests/ mirrors the code: tests/exporter/, tests/healthd/ and tests/container/ have a directory only where the
source has that package, and none holds an ``__init__.py`` (under importlib mode a test package named like a source
package, such as tests/healthd/partition/, would shadow it). No other test package is named like an installed
module either: pytest imports tests/<name>/test_x.py as <name>.test_x, and <name> then shadows the library."""

from __future__ import annotations

from importlib.metadata import packages_distributions
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


def test_no_test_package_shadows_an_installed_module() -> None:
    installed = packages_distributions()
    packages = [d.name for d in TESTS.iterdir() if (d / "__init__.py").is_file()]
    assert packages and [name for name in packages if name in installed] == []
