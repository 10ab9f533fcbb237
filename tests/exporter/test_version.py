"""The version the daemon reports is pyproject.toml's (the .deb, the image and the chart take theirs from there)."""

from __future__ import annotations

import tomllib

from exporter.version import VERSION
from tests.support.paths import REPO


def test_the_version_is_pyprojects() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        assert tomllib.load(f)["project"]["version"] == VERSION
