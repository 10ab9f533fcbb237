"""The shape every part of the daemon has: a name, its metric collectors, its gRPC services, start and stop.

The daemon is an ordered list of components (healthd/daemon/daemon.py): it gathers their collectors into one
registry and their services onto its gRPC servers, starts them in order and stops them in reverse. A component's
``stop`` must return promptly and must not wait on the driver; the daemon bounds each stop anyway. Each component
module has a ``build(node)`` that makes its component from the node context (healthd/node.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from exporter.collectors.base import Collector
from healthd.rpc.server import Service


class Component(Protocol):
    name: str

    def collectors(self) -> Sequence[Collector]:
        """Metric collectors over the latest Snapshot (and this component's own state)."""
        ...

    def services(self) -> Sequence[Service]:
        """gRPC services; ``Service.admin`` ones go on the admin socket only, the rest on the main socket."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ComponentBase:
    """A component with nothing of each kind: a subclass overrides only what it has."""

    name = "component"

    def collectors(self) -> Sequence[Collector]:
        return ()

    def services(self) -> Sequence[Service]:
        return ()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
