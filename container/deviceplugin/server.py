"""One kubelet DevicePlugin gRPC server per resource, on its own socket in the device-plugins directory, and the
registration with kubelet.

Each server counts kubelet's ListAndWatch streams. Kubelet keeps exactly one per registered resource; when it has
none for a while although kubelet.sock is still there, kubelet has dropped this plugin's client (its runClient
can disconnect a freshly registered client when an old stream's end is processed late), and only a new
Register brings it back (plugin.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

import grpc
import structlog

from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.api.v1beta1 import api_pb2_grpc as kpb_grpc
from container.deviceplugin.errors import AllocationError

log = structlog.get_logger("container.deviceplugin.server")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class Resource(Protocol):
    name: str
    pre_start_required: bool

    def devices(self) -> list[kpb.Device]: ...

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]: ...

    async def allocate(self, ids: list[str]) -> kpb.ContainerAllocateResponse: ...

    async def pre_start(self, ids: list[str]) -> None: ...


class Changes:
    """A generation counter the ListAndWatch streams wait on; ``bump`` (sync, on the loop) wakes them all."""

    def __init__(self) -> None:
        self.generation = 0
        self._waiters: set[asyncio.Future[None]] = set()

    def bump(self) -> None:
        self.generation += 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait_beyond(self, generation: int) -> None:
        while self.generation <= generation:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)


def plugin_options(resource: Resource) -> kpb.DevicePluginOptions:
    """What the plugin tells kubelet it supports for ``resource``, at registration and when asked."""
    return kpb.DevicePluginOptions(
        pre_start_required=resource.pre_start_required, get_preferred_allocation_available=True
    )


class StreamCount:
    """kubelet's open ListAndWatch streams on one server, and since when there has been none."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.open = 0
        self.none_since: float | None = clock()

    def opened(self) -> None:
        self.open += 1
        self.none_since = None

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0:
            self.none_since = self._clock()

    def reset(self) -> None:
        """From now: a registration was just sent, so kubelet's stream is due."""
        if self.open == 0:
            self.none_since = self._clock()

    def missing_for(self) -> float:
        return 0.0 if self.none_since is None else self._clock() - self.none_since


class DevicePluginService(kpb_grpc.DevicePluginServicer):
    def __init__(
        self, resource: Resource, changes: Changes, streams: StreamCount, *, allocate_deadline: float = 25.0
    ) -> None:
        self._r = resource
        self._changes = changes
        self._streams = streams
        self._allocate_deadline = allocate_deadline

    async def GetDevicePluginOptions(  # noqa: N802
        self, request: kpb.Empty, context: grpc.aio.ServicerContext[kpb.Empty, kpb.DevicePluginOptions]
    ) -> kpb.DevicePluginOptions:
        return plugin_options(self._r)

    async def ListAndWatch(  # noqa: N802
        self, request: kpb.Empty, context: grpc.aio.ServicerContext[kpb.Empty, kpb.ListAndWatchResponse]
    ) -> AsyncIterator[kpb.ListAndWatchResponse]:
        last: list[kpb.Device] | None = None
        self._streams.opened()
        try:
            while True:
                generation = self._changes.generation
                devices = self._r.devices()
                if devices != last:
                    healthy = sum(1 for d in devices if d.health == "Healthy")
                    log.info("device list sent", resource=self._r.name, devices=len(devices), healthy=healthy)
                    yield kpb.ListAndWatchResponse(devices=devices)
                    last = devices
                await self._changes.wait_beyond(generation)
        finally:
            self._streams.closed()

    async def GetPreferredAllocation(  # noqa: N802
        self,
        request: kpb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[kpb.PreferredAllocationRequest, kpb.PreferredAllocationResponse],
    ) -> kpb.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            try:
                ids = await self._r.preferred(
                    list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
                )
            except AllocationError as exc:
                await context.abort(exc.code, exc.message)
            responses.append(kpb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return kpb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(  # noqa: N802
        self, request: kpb.AllocateRequest, context: grpc.aio.ServicerContext[kpb.AllocateRequest, kpb.AllocateResponse]
    ) -> kpb.AllocateResponse:
        responses = []
        deadline = asyncio.get_running_loop().time() + self._allocate_deadline  # one bound for the whole call
        for req in request.container_requests:
            try:
                responses.append(await self._allocate_before(deadline, list(req.devices_ids)))
            except AllocationError as exc:
                devices = [i[:200] for i in req.devices_ids[:8]]
                log.warning("allocate refused", resource=self._r.name, devices=devices, error=exc.message)
                await context.abort(exc.code, exc.message)
        return kpb.AllocateResponse(container_responses=responses)

    async def _allocate_before(self, deadline: float, ids: list[str]) -> kpb.ContainerAllocateResponse:
        """Kubelet calls Allocate with no deadline and admits nothing else meanwhile: bound it here."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._r.allocate(ids)
        except TimeoutError:
            raise AllocationError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{self._r.name}: xpu-device-plugin gave up after {self._allocate_deadline:g} s waiting for "
                "xpu-healthd; a partition made meanwhile is reclaimed when its lease ends",
            ) from None

    async def PreStartContainer(  # noqa: N802
        self,
        request: kpb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[kpb.PreStartContainerRequest, kpb.PreStartContainerResponse],
    ) -> kpb.PreStartContainerResponse:
        try:
            await self._r.pre_start(list(request.devices_ids))
        except AllocationError as exc:
            await context.abort(exc.code, exc.message)
        return kpb.PreStartContainerResponse()


def socket_name(resource_name: str) -> str:
    """``xpu-runtime-kit.io/gpu`` -> ``xpu-runtime-kit.io_gpu.sock``: resource names are unique per kubelet."""
    return resource_name.replace("/", "_") + ".sock"


def inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ResourceServer:
    """Serves one resource; restarted (new socket) when its socket file disappears, e.g. kubelet cleaned the dir."""

    def __init__(
        self, resource: Resource, changes: Changes, kubelet_dir: Path, *, allocate_deadline: float = 25.0
    ) -> None:
        self.resource = resource
        self._changes = changes
        self._allocate_deadline = allocate_deadline
        self.streams = StreamCount()
        self.kubelet_dir = kubelet_dir
        self.socket = kubelet_dir / socket_name(resource.name)
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int] | None = None
        self.registered_with: tuple[int, int] | None = None  # the kubelet socket's inode at registration

    @property
    def healthy(self) -> bool:
        return self._server is not None and self._inode is not None and inode(self.socket) == self._inode

    async def start(self) -> None:
        await self.stop()
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        self.streams = StreamCount()
        service = DevicePluginService(
            self.resource, self._changes, self.streams, allocate_deadline=self._allocate_deadline
        )
        kpb_grpc.add_DevicePluginServicer_to_server(service, server)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server
        self._inode = inode(self.socket)
        self.registered_with = None
        log.info("serving", resource=self.resource.name, socket=str(self.socket))

    async def stop(self) -> None:
        if self._server is None:
            return
        await self._server.stop(0.5)
        self._server = None
        if self._inode is not None and inode(self.socket) == self._inode:
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()  # ours, not a newer one
        self._inode = None

    async def register(self, kubelet_inode: tuple[int, int]) -> None:
        """Register with the kubelet behind ``kubelet.sock``; raises grpc errors (retried by the caller)."""
        async with grpc.aio.insecure_channel(f"unix:{self.kubelet_dir / KUBELET_SOCKET}") as channel:
            stub = kpb_grpc.RegistrationStub(channel)
            await stub.Register(
                kpb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource.name,
                    options=plugin_options(self.resource),
                ),
                timeout=10,
            )
        self.registered_with = kubelet_inode
        self.streams.reset()
        log.info("registered with kubelet", resource=self.resource.name, endpoint=self.socket.name)
