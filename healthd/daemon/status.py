"""The daemon's one node status (exporter/health.py, computed by the node context) in the standard gRPC health.

``Node.status()`` is cheap and thread-safe: /healthz (HTTP thread), the systemd STATUS line and the watchdog (event
loop), and the status page all call it. ``GrpcHealth`` mirrors it into ``grpc.health.v1`` on every server:
overall (``""``), per service hosted by that server (NOT_SERVING while it cannot serve) and per card
(``xpu.runtime.v1.gpu/<index>``: NOT_SERVING while the card is hung, lost, failing or stale), so a client that
only speaks the standard health protocol still learns which cards are hung.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import structlog

from exporter.health import CardState, NodeStatus

log = structlog.get_logger("status")

GPU_SERVICE_PREFIX = "xpu.runtime.v1.gpu/"
REFRESH_SECONDS = 1.0


class StatusSource(Protocol):
    """The node status (healthd/node.py's ``Node.status``)."""

    def status(self) -> NodeStatus: ...


class HealthTarget(Protocol):
    """A gRPC server whose standard health service GrpcHealth updates."""

    @property
    def service_names(self) -> frozenset[str]: ...

    async def set_health(self, name: str, serving: bool) -> None: ...


def reports(server: HealthTarget, name: str) -> bool:
    """Each socket reports the whole server, the cards, and only the services it hosts (the admin socket is not
    SERVING for a service that only the main socket serves)."""
    return name == "" or name.startswith(GPU_SERVICE_PREFIX) or name in server.service_names


class GrpcHealth:
    """Keeps grpc.health.v1 on the daemon's servers in step with the node status, once a second."""

    def __init__(
        self,
        node: StatusSource,
        servers: Sequence[HealthTarget],
        services: Mapping[str, Callable[[], bool]],
    ) -> None:
        self._node = node
        self._servers = servers
        self._services = services  # service name -> can it serve now?
        self._sent: dict[str, bool] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="grpc-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self) -> dict[str, bool]:
        """Compute and push every status; returns what was set."""
        status = self._node.status()
        wanted = {"": status.serving}
        for name, can_serve in self._services.items():
            try:
                wanted[name] = status.serving and can_serve()
            except Exception:
                log.exception("service readiness check failed", service=name)
                wanted[name] = False
        for card in status.cards:
            wanted[f"{GPU_SERVICE_PREFIX}{card.index}"] = card.state is CardState.OK
        for name, serving in wanted.items():
            if self._sent.get(name) == serving:
                continue
            for server in self._servers:
                if reports(server, name):
                    await server.set_health(name, serving)
            self._sent[name] = serving
        return wanted

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("grpc health refresh failed")
            await asyncio.sleep(REFRESH_SECONDS)
