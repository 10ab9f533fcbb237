"""The daemon's gRPC endpoints: every component's services on the main socket (and TCP with mTLS), the changes on
the admin socket, and grpc.health.v1 on both kept in step with the node status."""

from __future__ import annotations

import grp
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from exporter.collectors.base import Collector
from healthd.daemon.status import GrpcHealth, NodeHealth
from healthd.rpc.server import GrpcServer, Service
from healthd.rpc.transport import GrpcTls

log = structlog.get_logger("grpc")


class RpcEndpoints:
    name = "grpc"

    def __init__(
        self,
        services: Sequence[Service],
        node: NodeHealth,
        *,
        addresses: Sequence[str],
        tls: GrpcTls | None,
        socket_mode: int,
        socket_group: int | None,
        admin_socket: Path,
        admin_group: str,
    ) -> None:
        main = [s for s in services if not s.admin]
        admin = [s for s in services if s.admin]
        self.admin_socket = admin_socket
        self.main = GrpcServer(addresses, main, tls=tls, socket_mode=socket_mode, socket_group=socket_group)
        gid = grp.getgrnam(admin_group).gr_gid if admin_group else None
        self.admin = GrpcServer(
            [f"unix:{admin_socket}"], admin, socket_mode=0o660 if gid is not None else 0o600, socket_group=gid
        )
        readiness: dict[str, list[Service]] = {}
        for svc in services:
            readiness.setdefault(svc.full_name, []).append(svc)
        self.health = GrpcHealth(
            node,
            [self.main, self.admin],
            {name: _all_ready(group) for name, group in readiness.items()},
        )

    def collectors(self) -> Sequence[Collector]:
        return ()

    def services(self) -> Sequence[Service]:
        return ()

    async def start(self) -> None:
        await self.main.start()
        await self.admin.start()
        log.info("admin socket listening", path=str(self.admin_socket))
        self.health.start()

    async def stop(self) -> None:
        await self.health.stop()
        await self.main.stop(grace=2.0)
        await self.admin.stop(grace=1.0)


def _all_ready(services: Sequence[Service]) -> Callable[[], bool]:
    """A name served by several components is ready when each of them is."""
    return lambda: all(s.ready() for s in services)
