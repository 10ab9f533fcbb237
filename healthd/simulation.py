"""gRPC Simulation service: inject faults into the simulated backend of a running daemon."""

from __future__ import annotations

from typing import Any

import grpc

from exporter.backends.protocol import Backend
from exporter.backends.simulated import FAULT_PARAMS, SimulatedBackend
from healthd.api.v1 import simulation_pb2 as pb
from healthd.api.v1 import simulation_pb2_grpc as pb_grpc


class SimulationService(pb_grpc.SimulationServicer):
    def __init__(self, backend: Backend) -> None:
        self._sim = backend if isinstance(backend, SimulatedBackend) else None

    async def _require_sim(self, context: grpc.aio.ServicerContext) -> SimulatedBackend:
        if self._sim is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this daemon runs on real GPUs; fault injection needs --simulate"
            )
        assert self._sim is not None
        return self._sim

    async def InjectFault(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        sim = await self._require_sim(context)
        try:
            description = sim.inject(request.kind, request.gpu, dict(request.params))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.InjectFaultResponse(description=description)

    async def ClearFaults(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        sim = await self._require_sim(context)
        gpu = request.gpu if request.HasField("gpu") else None
        if gpu is not None and gpu >= len(sim.scenario.cards):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"gpu {gpu} does not exist (this node has {len(sim.scenario.cards)})"
            )
        return pb.ClearFaultsResponse(description=sim.clear(gpu))

    async def ListFaultKinds(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._require_sim(context)
        return pb.ListFaultKindsResponse(
            kinds=[pb.FaultKind(kind=k, params=sorted(v)) for k, v in sorted(FAULT_PARAMS.items())]
        )
