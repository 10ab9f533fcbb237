"""The simulation component: the Simulation gRPC service (fault injection), answering FAILED_PRECONDITION on real
GPUs."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from exporter.backends.protocol import Backend
from exporter.collectors.base import Collector
from healthd.rpc.server import Service
from healthd.sim.service import SimulationService

SERVICE_NAME = "xpu.runtime.v1.Simulation"


def add_simulation(servicer: SimulationService, server: grpc.aio.Server) -> None:
    from healthd.api.v1 import simulation_pb2_grpc

    simulation_pb2_grpc.add_SimulationServicer_to_server(servicer, server)


class SimulationComponent:
    name = "simulation"

    def __init__(self, backend: Backend) -> None:
        self._service = Service(SERVICE_NAME, SimulationService(backend.injector), add_simulation)

    def collectors(self) -> Sequence[Collector]:
        return ()

    def services(self) -> Sequence[Service]:
        return (self._service,)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
