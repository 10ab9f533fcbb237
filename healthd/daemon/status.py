"""The daemon's one node status (exporter/health.py) from its parts, and the same in the standard gRPC health.

``status()`` is cheap and thread-safe: /healthz (HTTP thread), the systemd STATUS line and the watchdog (event
loop), and the status page all call it. ``GrpcHealth`` mirrors it into ``grpc.health.v1`` on every server:
overall (``""``), per service (NOT_SERVING while that service cannot serve) and per card
(``xpu.runtime.v1.gpu/<index>``: NOT_SERVING while the card is hung, lost, failing or stale), so a client that
only speaks the standard health protocol still learns which cards are hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import structlog

from exporter.backends.lanes import DeviceAccess
from exporter.health import CardState, NodeStatus, summarize
from exporter.snapshot import Snapshot

log = structlog.get_logger("status")

GPU_SERVICE_PREFIX = "xpu.runtime.v1.gpu/"
REFRESH_SECONDS = 1.0


class NodeHealth:
    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        access: DeviceAccess,
        stale_seconds: float,
        backlogs: Callable[[], Mapping[str, int]] = dict,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._latest = latest
        self._access = access
        self.stale_seconds = stale_seconds
        self._backlogs = backlogs
        self._clock = clock

    def status(self) -> NodeStatus:
        try:
            backlogs = self._backlogs()
        except Exception:  # a broken backlog reader must not break /healthz
            log.exception("backlog reader failed")
            backlogs = {}
        return summarize(
            self._latest(),
            now=self._clock(),
            mono_now=self._access.now(),
            stale_seconds=self.stale_seconds,
            hung=self._access.hung(),
            backlogs=backlogs,
        )


class HealthTarget(Protocol):
    """A gRPC server whose standard health service GrpcHealth updates."""

    async def set_health(self, name: str, serving: bool) -> None: ...


class GrpcHealth:
    """Keeps grpc.health.v1 on the daemon's servers in step with the node status, once a second."""

    def __init__(
        self,
        node: NodeHealth,
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
