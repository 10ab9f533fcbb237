"""kubelet's DRA resource-health stream (KEP-4680), v1 and v1alpha1 (kubelet 1.34-1.36 call v1alpha1, newer ones
prefer v1; the messages are the same on the wire, so both are built as v1): every published device with its
health, sent whole on connect and again on every change. A device is UNHEALTHY while its card has a fault that
taints it, UNKNOWN while the daemon has been out of reach past the grace period, HEALTHY otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import grpc

from container.dra.api.dra_health.v1 import api_pb2 as health_v1
from container.dra.api.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from container.dra.api.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from container.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc

HEALTHY, UNHEALTHY, UNKNOWN = "healthy", "unhealthy", "unknown"


@dataclass(frozen=True, slots=True)
class DeviceState:
    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str = ""
    since: int = 0  # unix seconds the health was last determined


class HealthStreams:
    """The latest device health, fanned out to every open stream."""

    def __init__(self, check_timeout_seconds: int) -> None:
        self.check_timeout_seconds = check_timeout_seconds
        self._latest: tuple[DeviceState, ...] | None = None
        self._queues: set[asyncio.Queue[tuple[DeviceState, ...]]] = set()

    def update(self, states: tuple[DeviceState, ...]) -> None:
        old = {(s.pool, s.device): s for s in self._latest or ()}
        now = int(time.time())
        stamped = tuple(
            s if (prev := old.get((s.pool, s.device))) is None or prev.health != s.health or prev.message != s.message
            else DeviceState(s.pool, s.device, s.health, s.message, prev.since)
            for s in (DeviceState(s.pool, s.device, s.health, s.message, s.since or now) for s in states)
        )  # fmt: skip
        if stamped == self._latest:
            return
        self._latest = stamped
        for queue in self._queues:
            queue.put_nowait(stamped)

    async def follow(self) -> AsyncIterator[tuple[DeviceState, ...]]:
        queue: asyncio.Queue[tuple[DeviceState, ...]] = asyncio.Queue()
        self._queues.add(queue)
        try:
            if self._latest is not None:
                yield self._latest
            while True:
                yield await queue.get()
        finally:
            self._queues.discard(queue)


_STATUS: Mapping[str, health_v1.HealthStatus] = MappingProxyType(
    {HEALTHY: health_v1.HEALTHY, UNHEALTHY: health_v1.UNHEALTHY, UNKNOWN: health_v1.UNKNOWN}
)


def _response(states: tuple[DeviceState, ...], timeout: int) -> health_v1.NodeWatchResourcesResponse:
    return health_v1.NodeWatchResourcesResponse(
        devices=[
            health_v1.DeviceHealth(
                device=health_v1.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                health=_STATUS[s.health],
                last_updated_time=s.since,
                health_check_timeout_seconds=timeout,
                message=s.message,
            )
            for s in states
        ]
    )


class HealthV1(health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(  # noqa: N802
        self,
        request: health_v1.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[health_v1.NodeWatchResourcesRequest, health_v1.NodeWatchResourcesResponse],
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        async for states in self._streams.follow():
            yield _response(states, self._streams.check_timeout_seconds)


class HealthV1alpha1(health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(  # noqa: N802
        self,
        request: health_v1alpha1.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            health_v1alpha1.NodeWatchResourcesRequest, health_v1alpha1.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[health_v1alpha1.NodeWatchResourcesResponse]:
        async for states in self._streams.follow():
            message = _response(states, self._streams.check_timeout_seconds).SerializeToString()
            yield health_v1alpha1.NodeWatchResourcesResponse.FromString(message)
