"""The plugin process: follow the daemon (faults, capacity, partitions), keep one server per resource registered
with kubelet, and start over with kubelet when it restarts."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import structlog

from container.core.daemon_client import DaemonClient
from container.core.faults import FaultTracker
from container.core.inventory import Inventory
from container.deviceplugin.config import PluginConfig
from container.deviceplugin.resources import Context, Slices, WholeCards
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
        self.faults = FaultTracker(self.client, self.changes.bump)
        self.ctx = Context(
            client=self.client,
            domain=config.domain,
            lease_seconds=config.lease_seconds,
            view=lambda: self.inventory.view,
            out_of_service=lambda: self.faults.out_of_service(len(self.inventory.view.cards)),
            changed=self.refresh,
        )
        self.servers: dict[str, ResourceServer] = {}
        self._refresh_lock = asyncio.Lock()
        self._daemon_up = False

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

    async def refresh(self) -> None:
        """Read the daemon again; kubelet hears of any change. A daemon that does not answer leaves the last view."""
        async with self._refresh_lock:
            try:
                changed = await self.inventory.refresh()
            except grpc.aio.AioRpcError as exc:
                if self._daemon_up:
                    log.warning("daemon not answering; keeping the last view", error=exc.code().name)
                self._daemon_up = False
                return
            if not self._daemon_up:
                log.info("daemon reachable", cards=len(self.inventory.view.cards), address=self.config.healthd_socket)
            self._daemon_up = True
            if changed:
                self.changes.bump()

    async def _ensure_servers(self) -> None:
        kubelet = inode(self.kubelet_socket)
        for resource in self.wanted():
            if resource.name not in self.servers:
                self.servers[resource.name] = ResourceServer(resource, self.changes, self.config.kubelet_dir)
        for server in self.servers.values():
            restarted_kubelet = server.registered_with is not None and server.registered_with != kubelet
            if not server.healthy or restarted_kubelet:
                if server.registered_with is not None:
                    log.info("kubelet restarted or our socket is gone; serving again", resource=server.resource.name)
                await server.start()
            if kubelet is not None and server.registered_with != kubelet:
                try:
                    await server.register(kubelet)
                except grpc.aio.AioRpcError as exc:
                    log.warning("cannot register with kubelet yet", resource=server.resource.name, error=exc.details())

    async def run(self, stop: asyncio.Event) -> None:
        tracker = asyncio.create_task(self.faults.run(), name="fault-tracker")
        try:
            while not stop.is_set() and not self.inventory.loaded:
                await self.refresh()
                if not self.inventory.loaded:
                    await _wait(stop, 1.0)
            with contextlib.suppress(TimeoutError):  # serve with what is known; health follows when it arrives
                await asyncio.wait_for(self.faults.synced.wait(), FIRST_SYNC_SECONDS)
            loop = asyncio.get_running_loop()
            next_refresh = loop.time() + self.config.refresh_seconds
            while not stop.is_set():
                await self._ensure_servers()
                if loop.time() >= next_refresh:
                    await self.refresh()
                    next_refresh = loop.time() + self.config.refresh_seconds
                await _wait(stop, self.config.socket_check_seconds)
        finally:
            tracker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tracker
            for server in self.servers.values():
                await server.stop()
            await self.client.close()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
