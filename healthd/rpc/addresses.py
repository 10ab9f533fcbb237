"""gRPC listen and endpoint addresses: ``unix:/absolute/path`` or ``HOST:PORT``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DEFAULT_RUNTIME_DIR = Path("/run/xpu-runtime-kit")


def check_grpc_address(address: str) -> None:
    """Raises ValueError with the reason."""
    if address.startswith("unix:"):
        if not address[len("unix:") :].startswith("/"):
            raise ValueError(f"unix socket path must be absolute, got {address[:200]!r}")
        return
    host, sep, port = address.rpartition(":")
    # the length check comes before int(): a port of thousands of digits would fail there with Python's own text
    if not sep or not host or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise ValueError(f"expected unix:/path or HOST:PORT, got {address[:200]!r}")


def check_grpc_addresses(addresses: Iterable[str]) -> None:
    for address in addresses:
        check_grpc_address(address)


def default_runtime_dir() -> Path:
    """systemd's RuntimeDirectory when set, else /run/xpu-runtime-kit."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    return Path(runtime.split(":")[0]) if runtime else DEFAULT_RUNTIME_DIR


def default_socket_path() -> Path:
    return default_runtime_dir() / "healthd.sock"


def default_grpc_listen() -> str:
    return f"unix:{default_socket_path()}"
