"""The project version: pyproject.toml's, written here too so that the daemon does not scan the installed
distributions (importlib.metadata) at every start. tests/exporter/test_version.py keeps the two equal."""

from __future__ import annotations

VERSION = "0.1.0"
