"""The simulation component: on a simulated node, the node around the simulated GPUs, and everywhere the Simulation
gRPC service (fault injection on the admin socket, its kinds on both; FAILED_PRECONDITION on real GPUs).

The simulated node's files are what the real readers read in place of the host's (healthd/host/view.py): the sysfs
tree of the scenario's PCIe layout and the driver's device tables, written at start like the hardware a real node
boots with, and the proc tree, kubelet log directories and pod-resources socket that follow the simulated processes
(healthd/sim/node.py). So this component starts first and stops last, whatever else is configured.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence

import grpc
import structlog

from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.executor import in_daemon_thread
from exporter.topology.layout import simulated_sysfs
from healthd.component import ComponentBase
from healthd.host.simulated_devices import write_driver_tables
from healthd.host.view import HostView, SimulatedFiles
from healthd.node import Node
from healthd.rpc.server import Service
from healthd.sim.mig_state import SimulatedMigState
from healthd.sim.node import SimulatedNode
from healthd.sim.service import SimulationService

log = structlog.get_logger("simulation")

SERVICE_NAME = "xpu.runtime.v1.Simulation"


def add_simulation(servicer: SimulationService, server: grpc.aio.Server) -> None:
    from healthd.api.v1 import simulation_pb2_grpc

    simulation_pb2_grpc.add_SimulationServicer_to_server(servicer, server)


class SimulatedMachine:
    """The files around the simulated GPUs, under the paths the host view chose for them."""

    def __init__(self, backend: SimulatedBackend, files: SimulatedFiles) -> None:
        self.backend = backend
        self.files = files
        self.node = SimulatedNode(backend, files.node_root, serve_kubelet=files.serve_kubelet)
        self.mig_state = SimulatedMigState(backend, files.mig_state)
        self._unwatch: Callable[[], None] | None = None

    def start(self) -> None:
        scenario = self.backend.scenario
        sysfs = self.files.sysfs_root
        if simulated_sysfs(scenario.extra, [c.pci_bus_id for c in scenario.cards], sysfs) is None:
            # no [topology] in the scenario: an empty tree, never the host's /sys with fake GPUs
            shutil.rmtree(sysfs, ignore_errors=True)
            sysfs.mkdir(parents=True)
        write_driver_tables(self.files.driver_root)
        restored = self.mig_state.restore()  # the driver kept them while the daemon was down
        self._unwatch = self.backend.watch_workloads(self.mig_state.save)
        log.info(
            "simulated node",
            files=str(self.files.node_root.parent),
            sysfs_root=str(sysfs),
            mig_instances=restored,
        )
        self.node.start()

    def stop(self) -> None:
        self.node.stop()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None


class SimulationComponent(ComponentBase):
    name = "simulation"

    def __init__(self, backend: Backend, host: HostView) -> None:
        injector = backend.injector
        self._services = (
            Service(SERVICE_NAME, SimulationService(injector, writable=False), add_simulation),
            Service(SERVICE_NAME, SimulationService(injector, writable=True), add_simulation, admin=True),
        )
        files = host.simulated
        self.machine = SimulatedMachine(backend, files) if isinstance(backend, SimulatedBackend) and files else None

    def services(self) -> Sequence[Service]:
        return self._services

    async def start(self) -> None:
        if self.machine is not None:
            await in_daemon_thread(self.machine.start)

    async def stop(self) -> None:
        if self.machine is not None:
            await in_daemon_thread(self.machine.stop)


def build(node: Node) -> SimulationComponent:
    return SimulationComponent(node.backend, node.host)
