"""The daemon's gRPC endpoints: every component's services on the main socket (and TCP with mTLS), the changes on
the admin socket, and grpc.health.v1 on both kept in step with the node status. Built last, over the services of
every component before it, so its sockets come up once everything behind them has started."""

from __future__ import annotations

import grp
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from healthd.component import ComponentBase
from healthd.daemon.config import Config
from healthd.daemon.status import GrpcHealth, StatusSource
from healthd.node import Node
from healthd.rpc.server import GrpcServer, Service
from healthd.rpc.transport import GrpcTls, is_tcp, load_grpc_tls, socket_group_id

log = structlog.get_logger("grpc")


class RpcEndpoints(ComponentBase):
    name = "grpc"

    def __init__(
        self,
        services: Sequence[Service],
        node: StatusSource,
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


def build(node: Node) -> RpcEndpoints:
    config = node.settings(Config)
    transport = config.transport
    return RpcEndpoints(
        node.services(),
        node,
        addresses=config.grpc_addresses,
        tls=load_grpc_tls(transport, [a for a in config.grpc_addresses if is_tcp(a)]),
        socket_mode=transport.grpc_socket_mode,
        socket_group=socket_group_id(transport.grpc_socket_group),
        admin_socket=config.admin_socket,
        admin_group=config.daemon.admin_group,
    )
