"""The daemon's gRPC server: our services plus standard health and reflection, on a unix socket (and TCP).

Every call passes the request guard (healthd/rpc/guard.py): a request that does not decode is INVALID_ARGUMENT and
no handler exception reaches a client as Python text. Reflection answers in both the v1 and v1alpha protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from healthd.rpc.guard import RequestGuard
from healthd.rpc.health import HealthServicer
from healthd.rpc.reflection import enable_reflection
from healthd.rpc.sockets import BoundSocket, SocketInUseError, claim_socket_path
from healthd.rpc.transport import GrpcTls, secure_socket, server_credentials

log = structlog.get_logger("grpc")

SOCKET_MODE = 0o660
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Service:
    """One servicer and how to add it: ``add(servicer, server)`` is the generated add_XServicer_to_server."""

    full_name: str  # e.g. "xpu.runtime.v1.Simulation"
    servicer: object
    add: Callable[[Any, grpc.aio.Server], None]  # takes this servicer's class (each Service pairs its own two)
    admin: bool = False  # served on the admin socket only (changes), not on the main socket (reads)
    ready: Callable[[], bool] = lambda: True  # can it serve now? (grpc.health.v1 says NOT_SERVING while not)


class GrpcServer:
    def __init__(
        self,
        addresses: Sequence[str],
        services: Sequence[Service],
        *,
        tls: GrpcTls | None = None,
        socket_mode: int = SOCKET_MODE,
        socket_group: int | None = None,  # gid given to unix sockets; None keeps the daemon's group
    ) -> None:
        self._addresses = tuple(addresses)
        self._services = tuple(services)
        self._tls = tls
        self._socket_mode = socket_mode
        self._socket_group = socket_group
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self._health_set: set[str] = set()  # names whose status the daemon set (kept across start)
        self._sockets: list[BoundSocket] = []
        self.tcp_ports: list[int] = []  # bound ports of TCP listeners, in order (port 0 picks one)

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=[RequestGuard()])
        for svc in self._services:
            svc.add(svc.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [svc.full_name for svc in self._services]
        enable_reflection([*names, health.SERVICE_NAME], server)
        for address in self._addresses:
            if address.startswith("unix:"):
                path = _prepare_socket_path(address, Path(address[len("unix:") :]))
                _bind(address, server.add_insecure_port, address)
                self._sockets.append(BoundSocket.of(path))
            elif self._tls is None:
                raise ValueError(f"grpc listen {address!r}: TCP listeners need mTLS, which is not configured")
            else:
                credentials = server_credentials(self._tls)
                self.tcp_ports.append(_bind(address, server.add_secure_port, address, credentials))
        await server.start()
        for bound in self._sockets:
            secure_socket(bound.path, self._socket_mode, self._socket_group)
        for name in ["", *names]:
            if name not in self._health_set:
                await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        log.info("grpc listening", addresses=list(self._addresses), services=names, tcp_ports=self.tcp_ports)

    @property
    def service_names(self) -> frozenset[str]:
        """The services this server hosts: grpc.health.v1 reports these (and the whole server and the cards) only."""
        return frozenset(svc.full_name for svc in self._services)

    async def set_health(self, name: str, serving: bool) -> None:
        """Set grpc.health.v1 for ``name`` ("" is the whole server); the daemon mirrors its node status here."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self._health_set.add(name)
        await self._health.set(name, status)

    async def stop(self, grace: float = 5.0) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        for bound in self._sockets:
            bound.remove()  # only the file this server made: a replacement at that path is someone else's
        self._sockets.clear()
        self._server = None


def _bind(address: str, add: Callable[P, int], *args: P.args, **kwargs: P.kwargs) -> int:
    """grpc reports a failed bind as RuntimeError; make it the OSError the daemon reports as "cannot start"."""
    try:
        return add(*args, **kwargs)
    except RuntimeError as exc:
        raise OSError(f"grpc listen {address}: cannot bind ({exc})") from None


def _prepare_socket_path(address: str, path: Path) -> Path:
    """A stale socket left by a killed daemon is removed; one a live process serves is never taken over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        claim_socket_path(path)
    except SocketInUseError as exc:
        raise OSError(f"grpc listen {address}: {exc}") from None
    return path
