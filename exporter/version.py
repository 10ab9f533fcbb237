"""The project version, read from the installed distribution when there is one."""

from __future__ import annotations

from importlib import metadata


def _version() -> str:
    try:
        return metadata.version("xpu-runtime-kit")
    except metadata.PackageNotFoundError:
        return "0.0.0+source"


VERSION = _version()
