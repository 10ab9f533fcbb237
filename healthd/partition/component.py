"""The partitions component: manager, reconciler, CDI writer and the Partitions service (reads on the main socket,
changes on the admin socket). Paths, the driver's device tables and the MPS control come from the host view; which
pods exist, which card to use first and which cards are out of service, from the node's questions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import grpc
import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.collectors.base import Collector
from exporter.snapshot import Snapshot
from healthd.component import ComponentBase
from healthd.host.view import HostView
from healthd.node import Node
from healthd.partition.cdi import CdiWriter
from healthd.partition.cdi_cards import whole_card_devices
from healthd.partition.driverlibs import builtin_hook_path, discover_driver_edits
from healthd.partition.errors import PartitionError
from healthd.partition.manager import PartitionManager
from healthd.partition.metrics import PartitionCollector
from healthd.partition.model import PartitionRecord
from healthd.partition.mps import MpsControl, MpsSupervisor, NvidiaMpsControl, SimulatedMpsControl
from healthd.partition.owners import DeviceHolders, OwnerProbe, PodExists
from healthd.partition.planner import CardOrder, pick_card, topology_aware
from healthd.partition.reconciler import Reconciler
from healthd.partition.service import PartitionsService
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store
from healthd.rpc.server import Service

log = structlog.get_logger("partition")

SERVICE_NAME = "xpu.runtime.v1.Partitions"
STATE_FILE = "partitions.sqlite"


def add_partitions(servicer: PartitionsService, server: grpc.aio.Server) -> None:
    from healthd.api.v1 import partitions_pb2_grpc

    partitions_pb2_grpc.add_PartitionsServicer_to_server(servicer, server)


def mps_control(kind: str) -> MpsControl:
    return SimulatedMpsControl() if kind == "simulated" else NvidiaMpsControl()


class PartitionsComponent(ComponentBase):
    name = "partitions"

    def __init__(
        self,
        settings: PartitionSettings,
        device: GuardedBackend,
        host: HostView,
        state_dir: Path,
        *,
        runtime_dir: Path,
        snapshot: Callable[[], Snapshot | None] = lambda: None,
        pod_exists: PodExists | None = None,
        device_holders: DeviceHolders | None = None,
        clock: Callable[[], float] = time.time,
        mps: MpsControl | None = None,
        order_any: CardOrder = pick_card,
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,  # faulty cards "any" skips
    ) -> None:
        self.settings = settings
        self.runtime_dir = settings.runtime_dir or runtime_dir
        self.cdi_dir = host.cdi_dir
        self.store = Store(state_dir / STATE_FILE)
        self.devices = host.devices
        # the driver's libraries in every CDI device, unless the operator relies on nvidia-container-toolkit
        libraries = settings.cdi_driver_libraries == "auto" and host.driver_libraries
        self.mps = MpsSupervisor(mps or mps_control(host.mps_control), self.runtime_dir)
        cdi = CdiWriter(self.cdi_dir, common=discover_driver_edits() if libraries else None)
        self.manager = PartitionManager(
            device,
            self.store,
            self.mps,
            cdi,
            OwnerProbe(cgroup_root=host.cgroup_root, pod_exists=pod_exists, device_holders=device_holders, clock=clock),
            settings=settings,
            clock=clock,
            order_any=order_any,
            snapshot=snapshot,
            devices=self.devices,
            default_sharing=SharingPolicy(settings.tdm_sharing),
            out_of_service=out_of_service,
            partition_hook=builtin_hook_path(),
        )
        cdi.include(lambda: whole_card_devices(self.manager.cards, self.manager.modes, self.devices))
        self.reconciler = Reconciler(self.manager, settings.reconcile_interval_seconds, device_holders)
        self._retry: asyncio.Task[None] | None = None
        self.collector = PartitionCollector(
            self.manager.view, lambda: self.manager.reclaimed_total, lambda: dict(self.manager.reconcile_failures)
        )

    def collectors(self) -> Sequence[Collector]:
        return [self.collector]

    def records(self) -> tuple[PartitionRecord, ...]:
        """Every partition the manager knows (the status page lists them)."""
        return self.manager.view().partitions

    def services(self) -> Sequence[Service]:
        return [
            Service(SERVICE_NAME, PartitionsService(self.manager, writable=False), add_partitions),
            Service(
                SERVICE_NAME,
                PartitionsService(self.manager, writable=True),
                add_partitions,
                admin=True,
                ready=lambda: self.manager.ready,
            ),
        ]

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
        self.reconciler.start()
        log.info(
            "partitions serving",
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
        await self.manager.close()  # closes the store after its queued writes


def build(node: Node) -> PartitionsComponent | None:
    settings = node.settings(PartitionSettings)
    if not settings.enabled:
        return None
    return PartitionsComponent(
        settings,
        node.device,
        node.host,
        node.state_dir,
        runtime_dir=node.runtime_dir,
        snapshot=node.sampler.latest,
        pod_exists=node.pod_exists,
        device_holders=node.device_holders,
        clock=node.clock,
        order_any=topology_aware(node.first_card),
        out_of_service=node.out_of_service,
    )
