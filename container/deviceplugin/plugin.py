"""The plugin process: follow the daemon (faults, capacity, partitions), keep one server per resource registered
with kubelet, and start over with kubelet when it restarts or stops streaming.

Nothing waits for the whole node: the servers start with what the daemon has answered so far (a card that does
not answer joins when it does), and the daemon is read on its own task so that a frozen daemon cannot stall the
socket checks. When the daemon has not answered for ``daemon_grace_seconds`` every device turns Unhealthy and
Allocate is refused (container/core/liveness.py); both come back with the first answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.faults import FaultTracker
from container.core.inventory import Inventory, NodeView
from container.core.liveness import DaemonLiveness
from container.deviceplugin.config import PluginConfig
from container.deviceplugin.resources import Context, Slices, WholeCards
from container.deviceplugin.runtime_answer import RuntimeAnswer
from container.deviceplugin.server import KUBELET_SOCKET, Changes, Resource, ResourceServer, inode
from healthd.api.v1 import partitions_pb2

log = structlog.get_logger("deviceplugin")

FIRST_SYNC_SECONDS = 10.0


class Plugin:
    def __init__(self, config: PluginConfig) -> None:
        self.config = config
        self.client = DaemonClient(config.healthd_socket, config.admin_address, timeout=config.call_timeout_seconds)
        self.inventory = Inventory(self.client)
        self.changes = Changes()
        self.liveness = DaemonLiveness(config.daemon_grace_seconds)
        self.faults = FaultTracker(self.client, self.changes.bump, on_contact=self.liveness.contact)
        self.ctx = Context(
            client=self.client,
            domain=config.domain,
            lease_seconds=config.lease_seconds,
            view=lambda: self.inventory.view,
            out_of_service=lambda: self.faults.out_of_service(len(self.inventory.view.cards)),
            changed=self.refresh,
            unmonitored=self.liveness.unmonitored,
            read_now=self.read_now,
            answer=RuntimeAnswer(config.runtime, config.cdi_spec_dir),
            probe_timeout=config.probe_timeout_seconds,
            allocate_deadline=config.allocate_deadline_seconds,
        )
        self.servers: dict[str, ResourceServer] = {}
        self._refresh_lock = asyncio.Lock()
        self._daemon_up = False
        self._unmonitored = False
        self._kubelet_seen: bool | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.config.kubelet_dir / KUBELET_SOCKET

    def wanted(self) -> list[Resource]:
        """The resources to serve now: whole cards, every MIG profile of a card in MIG mode, the TDM shapes."""
        resources: list[Resource] = [WholeCards(self.ctx)] if self.config.whole_cards else []
        if self.config.mig:
            profiles = sorted(
                {
                    p
                    for c in self.inventory.view.cards
                    if c.mode == partitions_pb2.PARTITION_MODE_MIG
                    for p in c.profiles
                    if "+" not in p
                }
            )
            chosen = [p for p in profiles if not self.config.mig_profiles or p in self.config.mig_profiles]
            resources += [Slices(self.ctx, profile=p) for p in chosen]
        resources += [Slices(self.ctx, shape=s) for s in self.config.tdm_shapes]
        return resources

    # ----- the daemon ------------------------------------------------------------------------------------------

    async def read_now(self, within: float) -> NodeView:
        """Read the daemon within ``within`` seconds (an Allocate's probe); kubelet hears of any change."""
        try:
            changed = await self.inventory.refresh(within=within)
        except grpc.aio.AioRpcError as exc:
            self.liveness.failed(exc.code().name)
            raise
        self.liveness.contact()
        if changed:
            self.changes.bump()
        return self.inventory.view

    async def refresh(self) -> None:
        """Read the daemon again; kubelet hears of any change. A daemon that does not answer leaves the last view
        (and, past the grace period, every device Unhealthy)."""
        async with self._refresh_lock:
            try:
                changed = await self.inventory.refresh()
            except grpc.aio.AioRpcError as exc:
                self.liveness.failed(f"{exc.code().name}: {exc.details()}")
                if self._daemon_up:
                    log.warning("daemon not answering; keeping the last view", error=exc.code().name)
                self._daemon_up = False
                return
            self.liveness.contact()
            if not self._daemon_up:
                log.info("daemon reachable", cards=len(self.inventory.view.cards), address=self.config.healthd_socket)
            self._daemon_up = True
            if changed:
                self.changes.bump()
        self.check_monitored()

    def check_monitored(self) -> None:
        """Tell kubelet when the cards stop or start being monitored."""
        reason = self.liveness.unmonitored()
        if (reason is not None) == self._unmonitored:
            return
        self._unmonitored = reason is not None
        if reason is not None:
            log.error("every device Unhealthy: the daemon does not answer", reason=reason.message())
        else:
            log.info("the daemon answers again; devices follow its health", cards=len(self.inventory.view.cards))
        self.changes.bump()

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            await _wait(stop, self.config.refresh_seconds if self.inventory.loaded else 1.0)

    # ----- kubelet ---------------------------------------------------------------------------------------------

    def _note_kubelet(self, present: bool) -> None:
        if present == self._kubelet_seen:
            return
        if not present:
            log.warning(
                "no kubelet.sock in the kubelet directory; waiting for kubelet (is --kubelet-dir right?)",
                path=str(self.kubelet_socket),
            )
        elif self._kubelet_seen is False:
            log.info("kubelet.sock appeared; registering", path=str(self.kubelet_socket))
        self._kubelet_seen = present

    async def _ensure_servers(self) -> None:
        kubelet = inode(self.kubelet_socket)
        self._note_kubelet(kubelet is not None)
        for resource in self.wanted():
            if resource.name not in self.servers:
                self.servers[resource.name] = ResourceServer(
                    resource,
                    self.changes,
                    self.config.kubelet_dir,
                    allocate_deadline=self.config.allocate_deadline_seconds,
                )
        for server in self.servers.values():
            restarted_kubelet = server.registered_with is not None and server.registered_with != kubelet
            if not server.healthy or restarted_kubelet:
                if server.registered_with is not None:
                    log.info("kubelet restarted or our socket is gone; serving again", resource=server.resource.name)
                await server.start()
            dropped = (
                kubelet is not None
                and server.registered_with == kubelet
                and server.streams.missing_for() > self.config.stream_grace_seconds
            )
            if dropped:
                log.warning(
                    "kubelet has no ListAndWatch stream open; registering again",
                    resource=server.resource.name,
                    missing_seconds=round(server.streams.missing_for(), 1),
                )
            if kubelet is not None and (server.registered_with != kubelet or dropped):
                try:
                    await server.register(kubelet)
                except grpc.aio.AioRpcError as exc:
                    log.warning("cannot register with kubelet yet", resource=server.resource.name, error=exc.details())

    async def run(self, stop: asyncio.Event) -> None:
        tracker = asyncio.create_task(self.faults.run(), name="fault-tracker")
        reader = asyncio.create_task(self._refresh_loop(stop), name="daemon-reader")
        try:
            with contextlib.suppress(TimeoutError):  # serve with what is known; health follows when it arrives
                await asyncio.wait_for(self.faults.synced.wait(), FIRST_SYNC_SECONDS)
            while not stop.is_set():
                self.check_monitored()
                await self._ensure_servers()
                await _wait(stop, self.config.socket_check_seconds)
        finally:
            for task in (tracker, reader):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for server in self.servers.values():
                await server.stop()
            await self.client.close()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
