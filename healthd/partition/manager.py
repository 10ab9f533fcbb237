"""The partition manager: rules, per-card locks, MPS and MIG actions, state, CDI and owner reclaim.

Every change follows intent -> action -> result: the row is committed as ``creating``/``deleting`` before the GPU
or MPS is touched, so a restart after kill -9 can finish or undo what was in flight (``recover``).

Nothing here blocks the event loop: driver calls are awaited through the device-access layer (a hung card answers
UNAVAILABLE at once, naming the card), SQLite and the CDI file are written on the store's own executor, MPS control
and owner checks run on another. A create runs to its end even when its caller goes away (its client's deadline
passed): it is finished or rolled back, never left half-done. Reconcile passes run card by card, so a hung or
failing card is counted and skipped while every other card's leases and owners are still reclaimed.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from healthd.partition.capacity import CardCapacity, View
from healthd.partition.creation import CreateRequest, PartitionCreation
from healthd.partition.device_calls import MigInUseError, driver, find_instance, placement_of
from healthd.partition.errors import Kind, PartitionError, invalid, precondition, unavailable
from healthd.partition.ledger import new_partition_id
from healthd.partition.model import CardMode, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsError
from healthd.partition.requests import check_owner
from healthd.partition.settings import LEASE_MAX_SECONDS
from healthd.partition.sharing import SharingPolicy

__all__ = ["CardCapacity", "CreateRequest", "PartitionManager", "View", "new_partition_id"]

log = structlog.get_logger("partition")


def mig_mode_steps(gpu: int, enable: int) -> str:
    """How to change a card's MIG mode (or reset it) by hand. ``nvidia-smi -mig`` and ``-r`` refuse while any process
    holds the card through NVML or CUDA ("In use by another client"), and this daemon is such a process (it samples
    every card), as is every MPS control daemon it started (the ``xpu-mps-*`` units)."""
    return (
        f"as root, stop this daemon and its MPS control daemons first (`systemctl stop xpu-healthd 'xpu-mps-*'`: "
        f"nvidia-smi refuses while any NVML or CUDA client holds the card; this also pauses TDM partitions on other "
        f"cards, whose daemons xpu-healthd starts again), run `nvidia-smi -i {gpu} -mig {enable}`, then "
        f"`systemctl start xpu-healthd`"
    )


class PartitionManager(PartitionCreation):
    """The whole life cycle: start and recovery, card modes, create (PartitionCreation), delete, leases,
    reconcile passes and owner changes; what it knows is in PartitionLedger."""

    # ----- start, recovery and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn how many cards there are and the stored state, then let every card join on its own: a card that
        does not answer (hung, lost) waits, and its calls answer UNAVAILABLE naming it, while the others serve.
        Each reconcile pass tries the waiting cards again."""
        count = await driver(self.device.aio.device_count())
        self._count = count
        self._card_locks = {i: asyncio.Lock() for i in range(count)}
        self._stored_modes = await self._store(self.store.card_modes)
        self._records = {r.id: r for r in await self._store(self.store.all)}
        for record in [r for r in self._records.values() if r.gpu >= count]:
            log.error("partition's card is gone; dropping it", partition=record.id, gpu_uuid=record.gpu_uuid)
            await self._forget(record.id)
        await asyncio.gather(*(self._join(gpu) for gpu in range(count)))
        await self._write_cdi()
        self._publish()
        self.ready = True
        log.info(
            "partitions ready",
            partitions=len(self._records),
            mps=self.mps.control.name,
            waiting_for=sorted(self._unanswered),
        )

    async def _join(self, gpu: int) -> bool:
        """Read the card, take its stored mode, and finish or undo its stored rows. False (and the card waits)
        when the card does not answer."""
        async with self._card_locks[gpu]:
            try:
                info = await driver(self.device.aio.device_info(gpu))
            except PartitionError as exc:
                if gpu not in self._unanswered:  # once: the reason's wording changes with every pass (stuck for Ns)
                    log.warning("card not answering; partitions on it wait", gpu=gpu, error=exc.message)
                self._unanswered[gpu] = exc.message
                return False
            mode, policy = self._stored_modes.get(info.uuid, (CardMode.NONE, ""))
            self._modes[gpu] = mode
            if mode is CardMode.TDM:
                self._sharing[gpu] = SharingPolicy(policy or SharingPolicy.ISOLATED)
            self._infos[gpu] = info
            try:
                await self._refresh_hardware(gpu)
            except PartitionError as exc:
                log.warning("cannot read card", gpu=gpu, error=exc.message)
                self._hw_mig.setdefault(gpu, False)
                self._profiles.setdefault(gpu, ())
                self._foreign.setdefault(gpu, ())
            for record in [r for r in self._records.values() if r.gpu == gpu]:
                try:
                    await self._recover(record)
                except PartitionError as exc:  # failing again: its rows wait for the reconciler
                    log.error("cannot recover partition yet", partition=record.id, gpu=gpu, error=exc.message)
            joined_late = self._unanswered.pop(gpu, None) is not None
        if joined_late:
            log.info("card answers; its partitions are served", gpu=gpu)
        if self.ready:  # start() writes and publishes once for every card
            await self._write_cdi()
            self._publish()
        return True

    async def _recover(self, record: PartitionRecord) -> None:
        """Finish or undo a row after a restart, or a create that did not finish in time."""
        gpu = record.gpu
        if gpu not in self._infos:
            raise self._not_joined(gpu)
        if self._infos[gpu].uuid != record.gpu_uuid:
            log.error("partition's card is gone; dropping it", partition=record.id, gpu_uuid=record.gpu_uuid)
            await self._forget(record.id)
            return
        if record.state is State.DELETING:
            await self._teardown(record, retry_s=0.0, raise_in_use=False)
            return
        if record.mode is CardMode.TDM:
            try:
                await self._host(self._card_sharing(gpu).ensure, record)
            except MpsError as exc:
                log.error("cannot start MPS for stored partition; will retry", partition=record.id, error=str(exc))
            if record.state is State.CREATING:
                await self._save_ready(replace(record, state=State.READY))
            return
        # MIG: adopt our instance (also one whose create passed its deadline), or drop the row if there is none
        assert record.mig is not None
        instances = await driver(self.device.aio.mig_instances(gpu)) if self._hw_mig.get(gpu) else ()
        claimed = {r.mig.gpu_instance_id for r in self._records.values() if r.id != record.id and r.mig and r.mig.uuid}
        match = find_instance(instances, record.mig, claimed)
        if match is None:
            log.error("MIG instance of partition is gone; dropping it", partition=record.id, gpu=gpu)
            await self._forget(record.id)
            return
        adopted = replace(record, state=State.READY, mig=placement_of(match))
        if record.state is State.CREATING:
            await self._save_ready(adopted)
        else:  # ready already: start() writes the whole spec once every card has joined
            await self._save(adopted)
        log.info("adopted MIG instance", partition=record.id, gpu=gpu, gpu_instance_id=match.gpu_instance_id)
        await self._refresh_foreign(gpu)

    # ----- card mode ---------------------------------------------------------------------------------------

    async def set_mode(self, gpu_ref: str, mode: CardMode, sharing: SharingPolicy | None = None) -> CardCapacity:
        """``sharing``: the TDM sharing policy (None: the configured default); only for TDM."""
        gpu = self.resolve_gpu(gpu_ref)
        if sharing is not None and mode is not CardMode.TDM:
            raise invalid("sharing: applies only to mode tdm")
        policy = (sharing or self._default_sharing) if mode is CardMode.TDM else None
        async with self._card_locks[gpu]:
            current = self._modes[gpu]
            if mode is current and (policy is None or self._sharing.get(gpu) is policy):
                return self._capacity(gpu, room=True)
            on_card = [r for r in self._records.values() if r.gpu == gpu]
            if on_card:
                change = "mode" if mode is not current else "TDM sharing"
                raise precondition(
                    f"GPU {gpu} is in mode {current} with {len(on_card)} partition(s); delete them before changing "
                    f"its {change}"
                )
            try:
                await self._refresh_hardware(gpu)
            except PartitionError as exc:
                raise unavailable(f"{exc.message}; the mode stays {current}") from None
            if mode is CardMode.MIG and not self._hw_mig[gpu]:
                raise precondition(
                    f"GPU {gpu} does not have MIG mode enabled in hardware; {mig_mode_steps(gpu, 1)} (a GPU reset "
                    "may be needed), then retry"
                )
            if mode is CardMode.MIG and not self._profiles[gpu]:
                raise precondition(f"GPU {gpu} reports no MIG profiles")
            if mode is CardMode.TDM and self._hw_mig[gpu]:
                raise precondition(
                    f"GPU {gpu} has MIG mode enabled in hardware; TDM needs the whole card: with no MIG instances "
                    f"left, {mig_mode_steps(gpu, 0)}, then retry"
                )
            await self._store(self.store.set_card_mode, self._infos[gpu].uuid, mode, str(policy or ""))
            self._modes[gpu] = mode
            if policy is None:
                self._sharing.pop(gpu, None)
            else:
                self._sharing[gpu] = policy
            self._publish()
            await self._write_cdi()  # the whole-card device is listed for mode none only
            log.info("card mode set", gpu=gpu, mode=str(mode), previous=str(current), sharing=str(policy or ""))
            return self._capacity(gpu, room=True)

    # ----- delete, leases, reclaim -------------------------------------------------------------------------

    async def delete(self, partition_id: str) -> bool:
        record = self._records.get(partition_id)
        if record is None:
            return False
        async with self._card_locks[record.gpu]:
            record = self._records.get(partition_id)
            if record is None:
                return False
            await self._teardown(record, retry_s=self.destroy_retry_seconds, raise_in_use=True)
            return True

    async def _teardown(self, record: PartitionRecord, *, retry_s: float, raise_in_use: bool) -> bool:
        """Destroy the GPU side and forget the partition. False when a MIG instance is still in use."""
        if record.state is not State.DELETING:
            record = replace(record, state=State.DELETING)
            await self._save(record)
            await self._write_cdi()  # no new container gets a partition that is going away
        if record.mode is CardMode.TDM:
            others = [r for r in self._records.values() if r.gpu == record.gpu and r.id != record.id]
            await self._host(self._card_sharing(record.gpu).release, record, others)
        elif record.mig and record.mig.uuid:
            deadline = self.clock() + retry_s
            delay = 0.05
            while True:
                try:
                    await driver(self.device.aio.destroy_mig_instance(record.gpu, record.mig.gpu_instance_id))
                    break
                except MigInUseError as exc:
                    if self.clock() >= deadline:
                        log.warning("MIG instance in use; delete will be retried", partition=record.id)
                        if raise_in_use:
                            raise precondition(
                                f"partition {record.id}: {exc}; it is marked deleting and will be destroyed once "
                                "its processes exit"
                            ) from None
                        return False
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                except PartitionError as exc:
                    if exc.kind is not Kind.NOT_FOUND:
                        raise
                    break  # already gone
        await self._forget(record.id)
        await self._write_cdi()
        log.info("partition deleted", partition=record.id, gpu=record.gpu)
        return True

    async def renew_lease(self, partition_id: str, ttl_seconds: float) -> PartitionRecord:
        await self._follow_clock_steps()
        record = self.get(partition_id)
        if record.owner.kind is not OwnerKind.LEASE:
            raise precondition(f"partition {partition_id} is owned by {record.owner.describe()}, not a lease")
        if ttl_seconds < 0 or ttl_seconds > LEASE_MAX_SECONDS:
            raise invalid(f"ttl_seconds: must be 0-{LEASE_MAX_SECONDS:g}")
        if record.state is not State.READY or self.clock() >= record.lease_expires_at:
            raise precondition(f"partition {partition_id}: lease expired; it is being reclaimed")
        record = replace(record, lease_expires_at=self.clock() + (ttl_seconds or self.settings.lease_default_seconds))
        await self._save(record)
        return record

    async def reconcile(self) -> list[str]:
        """One pass, card by card: finish deletes and stale creates, reclaim partitions whose owner is gone,
        look for foreign MIG instances; then restart dead MPS daemons. A card that fails is counted and skipped."""
        reclaimed: list[str] = []
        await self._follow_clock_steps()
        for gpu in range(self._count):
            if gpu not in self._infos and not await self._join(gpu):
                self.reconcile_failures[f"gpu {gpu}"] += 1
                continue
            try:
                reclaimed += await self._reconcile_card(gpu)
            except Exception as exc:  # one card (hung, failing) must never stop the others
                self.reconcile_failures[f"gpu {gpu}"] += 1
                message = exc.message if isinstance(exc, PartitionError) else f"{type(exc).__name__}: {exc}"
                log.warning("reconcile of a card failed; the other cards go on", gpu=gpu, error=message)
        try:
            await self._host(self.mps.check)
        except Exception as exc:
            self.reconcile_failures["mps"] += 1
            log.warning("MPS check failed", error=f"{type(exc).__name__}: {exc}")
        return reclaimed

    async def _reconcile_card(self, gpu: int) -> list[str]:
        reclaimed: list[str] = []
        now = self.clock()
        for record in [r for r in self._records.values() if r.gpu == gpu]:
            if record.state is State.DELETING:
                async with self._card_locks[gpu]:
                    current = self._records.get(record.id)
                    if current is not None and await self._teardown(current, retry_s=0.0, raise_in_use=False):
                        reclaimed.append(record.id)
                continue
            if record.state is State.CREATING:
                stale = now - record.created_at >= self.creating_timeout_seconds
                if stale and record.id not in self._creating:
                    async with self._card_locks[gpu]:
                        current = self._records.get(record.id)
                        if current is not None and current.state is State.CREATING:
                            log.warning("finishing a create that did not complete", partition=record.id)
                            await self._recover(current)
                continue
            if record.owner.kind is not OwnerKind.LEASE and now - record.created_at < self.settings.owner_grace_seconds:
                continue
            alive = await self._host(self.owners.alive, record.owner, record.lease_expires_at)
            if alive is not False:
                continue
            log.info("owner gone; reclaiming partition", partition=record.id, owner=record.owner.describe())
            async with self._card_locks[gpu]:
                current = self._records.get(record.id)
                if current != record:
                    continue  # deleted or changed (a lease renewed) since the check: look again next pass
                if await self._teardown(current, retry_s=0.0, raise_in_use=False):
                    self.reclaimed_total += 1
                    reclaimed.append(record.id)
        if self._modes.get(gpu) is CardMode.MIG:
            async with self._card_locks[gpu]:
                await self._refresh_foreign(gpu)  # an operator may have made or removed instances
        return reclaimed

    async def rebind(self, partition_id: str, owner: Owner) -> PartitionRecord:
        """Give a ready partition a new owner (a kubelet device's lease becomes its pod); the lease ends with it."""
        check_owner(owner)
        gpu = self.get(partition_id).gpu
        async with self._card_locks[gpu]:
            record = self.get(partition_id)
            if record.state is not State.READY:
                raise precondition(f"partition {partition_id} is {record.state}; only a ready partition changes owner")
            expires = record.lease_expires_at if owner.kind is OwnerKind.LEASE else 0.0
            record = replace(record, owner=owner, lease_expires_at=expires)
            await self._save(record)
            log.info("partition owner changed", partition=record.id, owner=owner.describe())
            return record
