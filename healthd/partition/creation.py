"""Making a partition: request checks, idempotent request ids, card choice for "any", quota admission, and the
TDM (MPS) or MIG action, each run as its own task so a caller that goes away never leaves it half-done."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import structlog

from healthd.partition import planner
from healthd.partition.device_calls import driver, placement_of
from healthd.partition.errors import (
    Kind,
    PartitionError,
    UidConflictError,
    exhausted,
    invalid,
    precondition,
    unavailable,
)
from healthd.partition.ledger import PartitionLedger
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsError
from healthd.partition.owners import process_start_ticks
from healthd.partition.planner import Quota
from healthd.partition.quantity import MIB
from healthd.partition.requests import check_owner
from healthd.partition.settings import LEASE_MAX_SECONDS

__all__ = ["CreateRequest", "PartitionCreation"]

log = structlog.get_logger("partition")


@dataclass(frozen=True, slots=True)
class CreateRequest:
    owner: Owner
    gpu: str  # index, UUID or "any"
    compute_percent: int
    memory_mib: int
    request_id: str = ""
    lease_ttl_seconds: float = 0.0
    allow_faulty_gpus: bool = False  # "any": also cards whose faults take them out of service
    client_uid: int | None = None  # TDM: the uid its CUDA processes run as, when known (sharing.py, admit_uid)
    mig_profile: str = ""  # MIG: this GPU-instance profile (name or id) instead of the daemon's choice
    mig_placement_start: int | None = None  # with mig_profile: at this placement

    def fingerprint(self) -> str:
        fields: tuple[object, ...] = (
            self.owner,
            self.gpu,
            self.compute_percent,
            self.memory_mib,
            self.lease_ttl_seconds,
        )
        if self.client_uid is not None:  # appended only when given: ids of requests from before keep their match
            fields += (self.client_uid,)
        if self.mig_profile:
            fields += (self.mig_profile, self.mig_placement_start)
        return hashlib.sha256(repr(fields).encode()).hexdigest()[:32]


class PartitionCreation(PartitionLedger):
    # ----- create ------------------------------------------------------------------------------------------

    async def create(self, request: CreateRequest) -> PartitionRecord:
        check_owner(request.owner)
        if request.compute_percent < 0 or request.compute_percent > 100:
            raise invalid(f"compute_percent: must be 1-100 or 0 for no limit, got {request.compute_percent}")
        if request.request_id and (len(request.request_id) > 128 or not request.request_id.isprintable()):
            raise invalid("request_id: expected at most 128 printable characters")
        if request.lease_ttl_seconds < 0 or request.lease_ttl_seconds > LEASE_MAX_SECONDS:
            raise invalid(f"owner.lease.ttl_seconds: must be 0-{LEASE_MAX_SECONDS:g}")
        if request.owner.kind is not OwnerKind.LEASE and request.lease_ttl_seconds:
            raise invalid("ttl_seconds applies only to lease owners")
        await self._follow_clock_steps()  # a lease made now is not moved by a step made before
        # The create runs as its own task: a caller that goes away (its deadline passed) does not cut it short
        # half-way; it finishes (or rolls back) and the row never stays 'creating'.
        task = asyncio.ensure_future(self._create_once(request))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return await asyncio.shield(task)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # seen: its caller got it, or went away (its deadline passed) and cannot

    async def _create_once(self, request: CreateRequest) -> PartitionRecord:
        if not request.request_id:
            return await self._create(request)
        rid = request.request_id
        lock, users = self._request_locks.get(rid, (asyncio.Lock(), 0))
        self._request_locks[rid] = (lock, users + 1)
        try:
            async with lock:
                existing = await self._store(self.store.by_request_id, rid)
                if existing is not None:
                    if existing.request_fingerprint != request.fingerprint():
                        raise PartitionError(
                            Kind.CONFLICT,
                            f"request_id {rid[:100]!r} was used for a different request (partition {existing.id})",
                        )
                    if existing.state is State.CREATING:  # its create passed its deadline: no env, no CDI device yet
                        raise unavailable(
                            f"partition {existing.id} (request_id {rid[:100]!r}) is still being created: GPU "
                            f"{existing.gpu} has not answered; retry with the same request_id later"
                        )
                    if not self.card_known(existing.gpu):
                        raise self._not_joined(existing.gpu)
                    return existing
                return await self._create(request)
        finally:
            lock, users = self._request_locks[rid]
            if users == 1:
                del self._request_locks[rid]
            else:
                self._request_locks[rid] = (lock, users - 1)

    async def _create(self, request: CreateRequest) -> PartitionRecord:
        # what the caller sent, before the owner's process start time is added: a retry sends the same again
        fingerprint = request.fingerprint() if request.request_id else ""
        owner = request.owner
        if owner.kind is OwnerKind.PROCESS:
            ticks = await self._host(process_start_ticks, self._proc_root, owner.pid)
            if ticks is None:
                raise precondition(f"owner.process.pid: no process {owner.pid}")
            owner = replace(owner, pid_start_ticks=ticks)
        request = replace(request, owner=owner)
        quota = Quota(request.compute_percent, request.memory_mib)
        if request.gpu.strip().lower() == "any":
            return await self._create_any(request, quota, fingerprint)
        gpu = self.resolve_gpu(request.gpu)
        async with self._card_locks[gpu]:
            return await self._create_on(gpu, request, quota, fingerprint)

    async def _create_any(self, request: CreateRequest, quota: Quota, fingerprint: str) -> PartitionRecord:
        candidates = [
            (c.gpu, Quota(100 - c.compute_percent_allocated, c.memory_total_mib - c.memory_allocated_mib))
            for c in (self._capacity(i) for i in sorted(self._infos))
            if c.mode is not CardMode.NONE
        ]
        if not candidates:
            raise precondition("no card is in TDM or MIG mode; set a card's mode first (xpuctl partitions mode)")
        hung = set(self.device.access.hung_cards())  # never worth trying: it would fail at once
        faulty = set() if request.allow_faulty_gpus else set(self._out_of_service())
        if all(gpu in faulty | hung for gpu, _ in candidates):
            listed = ", ".join(str(gpu) for gpu, _ in candidates)
            raise exhausted(
                f"every partitionable card (GPU {listed}) is out of service: an active fault, or a hung driver call"
            )
        candidates = [c for c in candidates if c[0] not in faulty | hung]
        last: PartitionError | None = None
        refused: PartitionError | None = None  # a card that would make this uid's clients wait (sharing.admit_uid)
        for gpu in self._order_any(candidates, quota):
            async with self._card_locks[gpu]:
                try:
                    return await self._create_on(gpu, request, quota, fingerprint)
                except PartitionError as exc:
                    if isinstance(exc, UidConflictError):
                        refused = exc
                        continue
                    if exc.kind not in (Kind.EXHAUSTED, Kind.INVALID, Kind.UNAVAILABLE):
                        raise
                    last = exc
        if last is None and refused is not None:
            raise refused  # every card was refused for its uid: say so, not "full"
        assert last is not None
        raise exhausted(f"no card can hold the request: {last.message}")

    async def _create_on(self, gpu: int, request: CreateRequest, quota: Quota, fingerprint: str) -> PartitionRecord:
        mode = self._modes[gpu]
        info = self._infos[gpu]
        if mode is CardMode.NONE:
            raise precondition(f"GPU {gpu} is not partitionable (mode none); set its mode to tdm or mig first")
        if request.mig_profile and mode is not CardMode.MIG:
            raise precondition(f"GPU {gpu} is in {mode} mode: mig_profile needs a card in MIG mode")
        now = self.clock()
        lease_expires = 0.0
        if request.owner.kind is OwnerKind.LEASE:
            lease_expires = now + (request.lease_ttl_seconds or self.settings.lease_default_seconds)
        record = PartitionRecord(
            id=self._new_id(),
            gpu=gpu,
            gpu_uuid=info.uuid,
            mode=mode,
            compute_percent=quota.compute_percent,
            memory_mib=quota.memory_mib,
            owner=request.owner,
            state=State.CREATING,
            created_at=now,
            lease_expires_at=lease_expires,
            request_id=request.request_id,
            request_fingerprint=fingerprint,
            client_uid=request.client_uid,
        )
        if mode is CardMode.TDM:
            on_card = [r for r in self._records.values() if r.gpu == gpu]
            self._card_sharing(gpu).admit_uid(gpu, request.client_uid, on_card)
            planner.admit_tdm(
                (Quota(r.compute_percent, r.memory_mib) for r in on_card), quota, info.memory_total_bytes // MIB
            )
            record = await self._start_tdm(record)
        else:
            record = await self._start_mig(gpu, record, quota, request)
        log.info(
            "partition created",
            partition=record.id,
            gpu=gpu,
            mode=str(mode),
            compute_percent=record.compute_percent,
            memory_mib=record.memory_mib,
            owner=record.owner.describe(),
            mig_profile=record.mig.profile_name if record.mig else None,
        )
        return record

    def _finish_when_answered(self, record: PartitionRecord, outcome: Future[Any]) -> None:
        """Once a late MIG create returns (on the lane's thread), recover its row on the event loop."""
        loop = asyncio.get_running_loop()

        def answered(_: Future[Any]) -> None:
            if loop.is_closed():
                return  # the daemon stopped meanwhile: the next start recovers the row
            finish = self._finish_late_create(record.id, record.gpu)
            try:
                loop.call_soon_threadsafe(self._spawn, finish)
            except RuntimeError:  # closed between the check and the call
                finish.close()

        outcome.add_done_callback(answered)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _finish_late_create(self, partition_id: str, gpu: int) -> None:
        async with self._card_locks[gpu]:
            current = self._records.get(partition_id)
            if current is None or current.state is not State.CREATING or partition_id in self._creating:
                return
            try:
                await self._recover(current)
            except PartitionError as exc:  # the card failed again: the reconciler tries later
                log.warning("cannot finish a late create yet", partition=partition_id, error=exc.message)

    async def _recover(self, record: PartitionRecord) -> None:
        """Finish or undo a row left in flight (PartitionManager)."""
        raise NotImplementedError

    async def _start_tdm(self, record: PartitionRecord) -> PartitionRecord:
        await self._insert(record)
        self._creating.add(record.id)
        try:
            try:
                await self._host(self._card_sharing(record.gpu).ensure, record)
            except MpsError as exc:
                await self._forget(record.id)
                raise unavailable(f"MPS control daemon for GPU {record.gpu} did not start: {exc}") from exc
            record = replace(record, state=State.READY)
            await self._save_ready(record)
            return record
        finally:
            self._creating.discard(record.id)

    async def _start_mig(
        self, gpu: int, record: PartitionRecord, quota: Quota, request: CreateRequest
    ) -> PartitionRecord:
        instances = await self._refresh_foreign(gpu)
        profiles = self._profiles[gpu]
        # creates that passed their deadline may still make their instance: their placement stays taken
        in_flight = [
            r.mig
            for r in self._records.values()
            if r.gpu == gpu
            and r.mig is not None
            and not r.mig.uuid
            and not any(i.placement_start == r.mig.placement_start for i in instances)
        ]
        occupied = planner.occupied(profiles, [*instances, *in_flight])
        if request.mig_profile:
            choice = planner.place_profile(profiles, occupied, request.mig_profile, request.mig_placement_start)
        else:
            choice = planner.choose_mig(profiles, occupied, quota)
        record = replace(
            record, mig=MigPlacement(choice.profile.profile_id, choice.profile.name, choice.start, choice.size)
        )
        await self._insert(record)
        self._creating.add(record.id)
        try:
            pending = self.device.aio.create_mig_instance(gpu, choice.profile.profile_id, choice.start)
            try:
                inst = await driver(pending.wait())
            except PartitionError as exc:
                outcome = pending.outcome
                if outcome.done() and outcome.exception() is None:
                    inst = outcome.result()  # it answered just after its deadline: ours after all
                elif outcome.done():
                    await self._forget(record.id)  # never made (refused, or never tried on a hung card)
                    raise
                else:
                    # Still in the driver, which may yet make it: keep the row (and its placement) 'creating'; it is
                    # adopted (or dropped, if no instance appeared) as soon as the driver answers.
                    log.warning("MIG create passed its deadline; the partition stays creating", partition=record.id)
                    self._finish_when_answered(record, outcome)
                    raise unavailable(
                        f"{exc.message}; partition {record.id} stays 'creating' until the card answers, then it "
                        "is adopted or removed"
                    ) from None
            record = replace(record, state=State.READY, mig=placement_of(inst))
            await self._save_ready(record)
            return record
        finally:
            self._creating.discard(record.id)
