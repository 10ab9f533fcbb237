"""Keep this node's ResourceSlices and device health current: cards changing mode, filling up, faulting, recovering.

Two kinds of wake-up: a fault change (the core fault tracker follows the daemon's WatchFaults stream, so a card is
tainted as soon as the daemon publishes the fault, not at the next poll), which republishes with the view already
held; and a refresh (every ``refresh_seconds``), which reads capacity, partitions and topology from the daemon
first. Publishing runs in a thread (the Kubernetes client blocks); a
failed write is retried a second later.

Taints (KEP-5055): a card out of service (container/core/faults.py: action reset_gpu or stronger, hung or lost)
gets ``xpu-runtime-kit.io/fault=<code>`` with the configured effect; it goes when the fault resolves. When the
daemon has not answered for ``unmonitored_grace_seconds``, every device gets ``xpu-runtime-kit.io/fault=
unmonitored`` (NoSchedule: nothing known is wrong with the cards, running pods stay).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import grpc
import structlog
from kubernetes.client import models as k

from container.core.faults import FaultTracker
from container.core.inventory import Inventory, NodeView
from container.core.ownership import claim_uid_of
from container.dra import names, slices
from container.dra.config import DriverConfig
from container.dra.health import HEALTHY, UNHEALTHY, UNKNOWN, DeviceState, HealthStreams
from container.dra.kubeapi import KubeApi, Published
from healthd.api.v1 import partitions_pb2, topology_pb2

log = structlog.get_logger("dra.publisher")

RETRY_SECONDS = 1.0


def node_facts(view: NodeView) -> slices.NodeFacts:
    """What the slices need beyond capacity and topology, from the daemon's capacity reply (node-wide: one driver
    and one card model per node)."""
    driver = next((c.driver_version for c in view.capacity if c.driver_version), "")
    architecture = next((c.architecture for c in view.capacity if c.architecture), "")
    placements: dict[int, tuple[tuple[int, int], ...]] = {}
    for card in view.capacity:
        for p in card.mig_profiles:
            placements.setdefault(p.profile_id, tuple((r.start, r.size) for r in p.placements))
    memory_slices = max((c.mig_memory_slices for c in view.capacity), default=0)
    return slices.NodeFacts(driver, architecture, placements, memory_slices)


def busy_placements(view: NodeView) -> dict[int, list[tuple[int, int]]]:
    """MIG placements held by partitions that are not a claim's (another front end's): never offered."""
    busy: dict[int, list[tuple[int, int]]] = {}
    for p in view.partitions:
        if p.HasField("mig") and claim_uid_of(p) is None:
            busy.setdefault(p.gpu, []).append((p.mig.placement_start, p.mig.placement_size))
    return busy


class Publisher:
    def __init__(
        self,
        kube: KubeApi,
        inventory: Inventory,
        faults: FaultTracker,
        health: HealthStreams,
        config: DriverConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._inventory = inventory
        self._faults = faults
        self._health = health
        self._config = config
        self._clock = clock
        self._wake = asyncio.Event()
        self._refresh_due = True
        self._last_contact = clock()  # the grace period starts with the driver
        self._owner: k.V1OwnerReference | None = None
        self.published: Published | None = None
        self._last_pool: slices.Pool | None = None

    def fault_changed(self) -> None:
        self._wake.set()

    @property
    def unmonitored(self) -> bool:
        return self._clock() - self._last_contact > self._config.unmonitored_grace_seconds

    def taints(self) -> dict[int, list[slices.CardTaint]]:
        unmonitored = self.unmonitored
        effect = self._config.fault_taint_effect
        out: dict[int, list[slices.CardTaint]] = {}
        for card in self._inventory.view.capacity:
            taints = []
            if codes := self._faults.codes(card.gpu):
                taints.append(slices.CardTaint(codes[0], effect))
            if unmonitored and not (codes and effect == "NoSchedule"):  # one taint per key and effect
                taints.append(slices.CardTaint(names.UNMONITORED, "NoSchedule"))
            if taints:
                out[card.gpu] = taints
        return out

    def build(self, generation: int) -> slices.Pool:
        view = self._inventory.view
        self._last_pool = slices.build_pool(
            self._config.node_name,
            partitions_pb2.GetCapacityResponse(cards=view.capacity),
            view.topology or topology_pb2.GetTopologyResponse(),
            node_facts(view),
            taints=self.taints(),
            busy_placements=busy_placements(view),
            generation=generation,
            owner=self._owner,
        )
        return self._last_pool

    def device_health(self, pool: slices.Pool) -> tuple[DeviceState, ...]:
        unmonitored = self.unmonitored
        states = []
        for s in pool.slices:
            for device in (s.spec.devices if s.spec is not None else None) or ():
                index = (device.attributes or {}).get(names.INDEX)
                gpu = index.int if index is not None and index.int is not None else -1
                codes = self._faults.codes(gpu)
                if codes:
                    states.append(DeviceState(pool.node_name, device.name, UNHEALTHY, ", ".join(codes)))
                elif unmonitored:
                    states.append(DeviceState(pool.node_name, device.name, UNKNOWN, "xpu-healthd not reachable"))
                else:
                    states.append(DeviceState(pool.node_name, device.name, HEALTHY))
        return tuple(states)

    async def _refresh(self) -> None:
        try:
            await self._inventory.refresh()
        except grpc.aio.AioRpcError as exc:
            log.warning("daemon not answering; keeping the last view", error=exc.code().name)
            return
        self._last_contact = self._clock()
        self._refresh_due = False

    async def _owner_reference(self) -> None:
        try:
            uid = await asyncio.to_thread(self._kube.node_uid)
        except Exception as exc:
            log.warning("cannot read the Node; slices go without an owner for now", error=str(exc)[:200])
            return
        self._owner = slices.node_owner(self._config.node_name, uid)

    async def publish_once(self) -> bool:
        """Refresh when due, then write the pool and the health; False when the API server refused or failed."""
        if self._refresh_due:
            await self._refresh()
        if not self._inventory.loaded:
            return False
        if self._owner is None:
            await self._owner_reference()
        try:
            self.published = await asyncio.to_thread(self._kube.publish, self.build)
        except Exception as exc:
            log.warning("publishing ResourceSlices failed; retrying", error=str(exc)[:300])
            return False
        if self.published.changed:
            log.info(
                "ResourceSlices published",
                generation=self.published.generation,
                created=len(self.published.created),
                updated=len(self.published.updated),
                deleted=len(self.published.deleted),
            )
        if self._last_pool is not None:
            self._health.update(self.device_health(self._last_pool))
        return True

    async def run(self, stop: asyncio.Event) -> None:
        next_refresh = self._clock()
        while not stop.is_set():
            self._wake.clear()
            if self._clock() >= next_refresh:
                self._refresh_due = True
                next_refresh = self._clock() + self._config.refresh_seconds
            ok = await self.publish_once()
            wait = min(self._config.refresh_seconds, max(0.0, next_refresh - self._clock()))
            if not ok or self._refresh_due:
                wait = min(wait, RETRY_SECONDS)
            if not self.unmonitored and self._refresh_due:
                # out of reach: look again before the grace period ends, so the unmonitored taint is on time
                left = self._last_contact + self._config.unmonitored_grace_seconds - self._clock()
                wait = min(wait, max(0.05, left + 0.05))
            await _wait_any(stop, self._wake, wait)


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    waiters: set[asyncio.Task[Any]] = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiters:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
