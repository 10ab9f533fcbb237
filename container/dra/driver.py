"""The driver process: the shared core (daemon client, inventory, fault tracking) under a Preparer, a Publisher and
the kubelet-facing servers.

Start order: read the checkpoint, follow the daemon's faults, wait for the first inventory, reconcile (partitions
of claims that are gone are deleted), serve DRA and health on ``<plugin dir>/dra.sock``, publish the slices, and
only then put the registration socket in kubelet's registry, so kubelet never calls a half-started plugin. Stop
removes the registration socket (kubelet deregisters; the slices stay, kubelet wipes them 30 s later unless the
driver is back) and leaves every prepared claim as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.faults import FaultTracker
from container.core.inventory import Inventory
from container.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from container.dra.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from container.dra.api.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from container.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from container.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from container.dra.checkpoint import Checkpoint
from container.dra.config import DriverConfig
from container.dra.health import HealthStreams, HealthV1, HealthV1alpha1
from container.dra.kubeapi import KubeApi
from container.dra.plugin_server import DraV1, DraV1beta1
from container.dra.prepare import Preparer
from container.dra.publisher import Publisher
from container.dra.registration import Registration, unix_server

log = structlog.get_logger("dra")

RECONCILE_RETRY_SECONDS = 2.0


class RegistrationRefusedError(Exception):
    pass


class Driver:
    def __init__(self, config: DriverConfig, kube: KubeApi) -> None:
        self.config = config
        self.kube = kube
        self.client = DaemonClient(config.healthd_socket, config.admin_address, timeout=config.call_timeout_seconds)
        self.inventory = Inventory(self.client)
        self.health = HealthStreams(config.health_check_timeout_seconds)
        self.checkpoint = Checkpoint(config.checkpoint_file)
        self.faults = FaultTracker(self.client, self._fault_changed)
        self.publisher = Publisher(kube, self.inventory, self.faults, self.health, config)
        # a claim's own partitions change no slice (its device stays published: the scheduler counts it as
        # allocated), so prepares do not republish; the periodic refresh sees other front ends' partitions
        self.preparer = Preparer(self.client, self.inventory, kube, self.checkpoint, config.node_name)

    def _fault_changed(self) -> None:
        self.publisher.fault_changed()

    async def _first_inventory(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.inventory.refresh()
                return
            except grpc.aio.AioRpcError as exc:
                log.warning("daemon not reachable yet", address=self.config.healthd_socket, error=exc.code().name)
            await _sleep(stop, 1.0)

    async def _reconcile(self, stop: asyncio.Event) -> None:
        """Until it has worked once: the API server or the daemon may not answer yet."""
        while not stop.is_set():
            try:
                gone = await self.preparer.reconcile()
                log.info("reconciled prepared claims", kept=len(self.checkpoint.claims), cleaned=len(gone))
                return
            except Exception as exc:
                log.warning("reconcile failed; retrying", error=str(exc)[:300])
            await _sleep(stop, RECONCILE_RETRY_SECONDS)

    async def run(self, stop: asyncio.Event) -> None:
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint.load()
        tracker = asyncio.create_task(self.faults.run(), name="fault-tracker")
        servers: list[grpc.aio.Server] = []
        publisher: asyncio.Task[None] | None = None
        try:
            await self._first_inventory(stop)
            await self._reconcile(stop)
            if stop.is_set():
                return
            servers.append(
                await unix_server(
                    self.config.plugin_socket,
                    (DraV1(self.preparer), dra_v1_grpc.add_DRAPluginServicer_to_server),
                    (DraV1beta1(self.preparer), dra_v1beta1_grpc.add_DRAPluginServicer_to_server),
                    (HealthV1(self.health), health_v1_grpc.add_DRAResourceHealthServicer_to_server),
                    (HealthV1alpha1(self.health), health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server),
                )
            )
            publisher = asyncio.create_task(self.publisher.run(stop), name="publisher")
            registration = Registration(self.config.plugin_socket)
            servers.append(
                await unix_server(
                    self.config.registration_socket, (registration, reg_grpc.add_RegistrationServicer_to_server)
                )
            )
            log.info("serving", plugin_socket=str(self.config.plugin_socket), node=self.config.node_name)
            stopped = asyncio.ensure_future(stop.wait())
            waiters: set[asyncio.Future[Any]] = {stopped, registration.refused}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if registration.refused.done():
                raise RegistrationRefusedError(registration.refused.result())
        finally:
            self.config.registration_socket.unlink(missing_ok=True)
            for server in reversed(servers):
                await server.stop(grace=1.0)
            for task in (tracker, publisher):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.client.close()


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
