"""kubelet plugin registration (pluginregistration v1): a socket in kubelet's plugins_registry that answers GetInfo
with the driver's name, its DRA endpoint and the services it offers, and hears back whether kubelet took it.

``supported_versions`` lists the DRA services first, newest first (kubelet uses the first it knows: v1 on 1.34 and
later, v1beta1 before), then both health services (kubelet 1.37 prefers v1, 1.34-1.36 know only v1alpha1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import structlog

from container.dra import names
from container.dra.api.pluginregistration.v1 import api_pb2 as reg
from container.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = structlog.get_logger("dra.registration")

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self._endpoint = endpoint
        self.refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.registered = asyncio.Event()

    async def GetInfo(  # noqa: N802
        self, request: reg.InfoRequest, context: grpc.aio.ServicerContext[reg.InfoRequest, reg.PluginInfo]
    ) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin", name=names.DRIVER, endpoint=str(self._endpoint), supported_versions=SUPPORTED_VERSIONS
        )

    async def NotifyRegistrationStatus(  # noqa: N802
        self,
        request: reg.RegistrationStatus,
        context: grpc.aio.ServicerContext[reg.RegistrationStatus, reg.RegistrationStatusResponse],
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with kubelet", driver=names.DRIVER, endpoint=str(self._endpoint))
            self.registered.set()
        else:
            log.error("kubelet refused the registration", error=request.error)
            if not self.refused.done():
                self.refused.set_result(request.error)
        return reg.RegistrationStatusResponse()


async def unix_server(path: Path, *servicers: tuple[object, object]) -> grpc.aio.Server:
    """A started gRPC server on a unix socket at ``path`` (a stale socket from a previous run is removed first);
    each servicer comes with its ``add_..._to_server`` function."""
    _fresh_socket_path(path)
    server = grpc.aio.server()
    for servicer, add in servicers:
        add(servicer, server)  # type: ignore[operator]
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


def _fresh_socket_path(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
