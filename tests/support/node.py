"""The daemon's node context over any backend, as the daemon opens it (for tests that build components alone)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from exporter.backends.protocol import Backend
from healthd.daemon.config import Config, with_overrides
from healthd.daemon.daemon import open_node
from healthd.host.simulated_devices import write_driver_tables
from healthd.node import Node


def node_on(
    backend: Backend, state_dir: Path, config: Config | None = None, *, runtime_dir: Path | None = None
) -> Node:
    """``backend``'s node with its state under ``state_dir`` and its sockets in ``runtime_dir`` (beside it unless
    given); the metrics port is any free one. The simulated driver tables are written (nothing is started)."""
    run = runtime_dir or state_dir.parent / "run"
    config = with_overrides(
        config or Config(),
        state_dir=state_dir,
        metrics_listen="127.0.0.1:0",
        grpc_listen=(f"unix:{run}/healthd.sock",),
    )
    config = replace(config, daemon=replace(config.daemon, admin_socket=run / "healthd-admin.sock"))
    node = open_node(config, backend)
    if node.host.simulated is not None:
        write_driver_tables(node.host.simulated.driver_root)
    return node
