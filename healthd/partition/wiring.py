"""Build the partition components from the config; the daemon calls start()/stop() and adds the collector."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.snapshot import Snapshot
from healthd.config import DEFAULT_RUNTIME_DIR, PartitionSettings
from healthd.partition.cdi import CdiWriter
from healthd.partition.cdi_cards import whole_card_devices
from healthd.partition.devnodes import HostDevices
from healthd.partition.driverlibs import discover_driver_edits
from healthd.partition.errors import PartitionError
from healthd.partition.manager import ManagerSettings, PartitionManager
from healthd.partition.metrics import PartitionCollector
from healthd.partition.mps import MpsControl, MpsSupervisor, NvidiaMpsControl, SimulatedMpsControl
from healthd.partition.owners import DeviceHolders, OwnerProbe, PodExists
from healthd.partition.planner import CardOrder, pick_card
from healthd.partition.reconciler import Reconciler
from healthd.partition.service import PartitionsService
from healthd.partition.sharing import SharingPolicy
from healthd.partition.simdevices import simulated_host_devices
from healthd.rpc.server import GrpcServer, Service

log = structlog.get_logger("partition")

SERVICE_NAME = "xpu.runtime.v1.Partitions"
STATE_FILE = "partitions.sqlite"
SYSTEM_CDI_DIR = Path("/var/run/cdi")
SIM_DEVICES_DIR = "simulated-driver"


def add_partitions(servicer: object, server: object) -> None:
    from healthd.api.v1 import partitions_pb2_grpc

    partitions_pb2_grpc.add_PartitionsServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def choose_mps(settings: PartitionSettings, backend: Backend) -> MpsControl:
    if settings.mps == "simulated" or (settings.mps == "auto" and isinstance(backend, SimulatedBackend)):
        return SimulatedMpsControl()
    return NvidiaMpsControl()


class Partitions:
    """Manager + reconciler + the admin gRPC server; ``read_service`` goes on the daemon's main (monitoring) socket."""

    def __init__(
        self,
        settings: PartitionSettings,
        device: Backend | GuardedBackend,
        state_dir: Path,
        *,
        snapshot: Callable[[], Snapshot | None] = lambda: None,
        main_socket: Path | None = None,
        pod_exists: PodExists | None = None,
        device_holders: DeviceHolders | None = None,
        clock: Callable[[], float] = time.time,
        mps: MpsControl | None = None,
        order_any: CardOrder = pick_card,
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,  # faulty cards "any" skips
        admin_services: Sequence[Service] = (),  # other services' write side (Health.ResolveFault) on the admin socket
    ) -> None:
        from healthd.partition.store import Store

        self.settings = settings
        backend = device if isinstance(device, GuardedBackend) else GuardedBackend(DeviceAccess(device))
        simulated = isinstance(backend.raw, SimulatedBackend)
        self.runtime_dir = settings.runtime_dir or (main_socket.parent if main_socket else DEFAULT_RUNTIME_DIR)
        self.admin_socket = settings.admin_socket or self.runtime_dir / "healthd-admin.sock"
        self.cdi_dir = settings.cdi_dir or (state_dir / "cdi" if simulated else SYSTEM_CDI_DIR)
        self.store = Store(state_dir / STATE_FILE)
        # CDI inputs: the driver's device tables (simulated under the state dir) and, on real GPUs, its libraries
        self.devices = simulated_host_devices(state_dir / SIM_DEVICES_DIR) if simulated else HostDevices()
        driver_edits = discover_driver_edits() if settings.cdi_driver_libraries == "auto" and not simulated else None
        self.mps = MpsSupervisor(mps or choose_mps(settings, backend.raw), self.runtime_dir)
        cdi = CdiWriter(self.cdi_dir, common=driver_edits)
        self.manager = PartitionManager(
            backend,
            self.store,
            self.mps,
            cdi,
            OwnerProbe(
                cgroup_root=settings.cgroup_root, pod_exists=pod_exists, device_holders=device_holders, clock=clock
            ),
            settings=ManagerSettings(
                lease_default_seconds=settings.lease_default_seconds,
                owner_grace_seconds=settings.owner_grace_seconds,
            ),
            clock=clock,
            order_any=order_any,
            snapshot=snapshot,
            devices=self.devices,
            default_sharing=SharingPolicy(settings.tdm_sharing),
            out_of_service=out_of_service,
        )
        cdi.include(lambda: whole_card_devices(self.manager.cards, self.devices))
        self.reconciler = Reconciler(self.manager, settings.reconcile_interval_seconds, device_holders)
        self.read_service = Service(SERVICE_NAME, PartitionsService(self.manager, writable=False), add_partitions)
        admin = Service(SERVICE_NAME, PartitionsService(self.manager, writable=True), add_partitions)
        gid = grp.getgrnam(settings.admin_group).gr_gid if settings.admin_group else None
        self.admin_server = GrpcServer(
            [f"unix:{self.admin_socket}"],
            [admin, *admin_services],
            socket_mode=0o660 if gid is not None else 0o600,
            socket_group=gid,
        )
        self.started = False
        self._retry: asyncio.Task[None] | None = None
        self.collector = PartitionCollector(
            self.manager.view, lambda: self.manager.reclaimed_total, lambda: dict(self.manager.reconcile_failures)
        )

    async def start(self) -> None:
        """Start now if the GPUs answer; otherwise keep trying in the background (the daemon runs on meanwhile)."""
        if not await self._try_start():
            self._retry = asyncio.create_task(self._retry_start(), name="partition-start")

    async def _try_start(self) -> bool:
        try:
            await self.manager.start()
        except PartitionError as exc:
            log.error("partitions cannot start yet; retrying", error=exc.message)
            return False
        await self.admin_server.start()
        self.reconciler.start()
        self.started = True
        log.info(
            "partitions serving",
            admin_socket=str(self.admin_socket),
            cdi_dir=str(self.cdi_dir),
            mps=self.mps.control.name,
            uid=os.getuid(),
        )
        return True

    async def _retry_start(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval_seconds)
            if await self._try_start():
                return

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        await self.reconciler.stop()
        await self.admin_server.stop()
        await self.manager.close()  # closes the store after its queued writes
