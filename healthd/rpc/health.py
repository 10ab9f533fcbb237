"""grpc.health.v1 with all three methods: grpcio-health-checking's servicer answers Check and Watch, and leaves
``List`` (added to the protocol in grpc/grpc-proto's health.proto, which reflection advertises) UNIMPLEMENTED.

``List`` answers every name this server has a status for, as a snapshot (the protocol calls it non-atomic): the
whole server (``""``), the services this socket hosts and the per-card names. The mirror it reads is kept by
``set`` and ``enter_graceful_shutdown``, the two ways a status changes.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2

LIST_LIMIT = 1000  # the protocol lets a server answer RESOURCE_EXHAUSTED rather than list without bound


class HealthServicer:
    """Check and Watch are the library's (its watchers and shutdown rules); List is answered from the mirror."""

    def __init__(self) -> None:
        self._inner = health.aio.HealthServicer()
        self.Check = self._inner.Check  # the protocol names its methods
        self.Watch = self._inner.Watch
        self._listed: dict[str, health_pb2.HealthCheckResponse.ServingStatus.ValueType] = {
            "": health_pb2.HealthCheckResponse.SERVING
        }
        self._shutting_down = False

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        await self._inner.set(service, status)
        if not self._shutting_down:  # the library ignores sets once it shuts down; so does the mirror
            self._listed[service] = status

    async def enter_graceful_shutdown(self) -> None:
        self._shutting_down = True
        await self._inner.enter_graceful_shutdown()
        self._listed = dict.fromkeys(self._listed, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def List(  # noqa: N802 (the protocol's method name)
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> health_pb2.HealthListResponse:
        if len(self._listed) > LIST_LIMIT:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {LIST_LIMIT} services")
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=s) for name, s in sorted(self._listed.items())}
        )
