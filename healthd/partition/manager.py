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
import hashlib
import secrets
import sqlite3
from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeadlineSettings, DeviceAccess
from exporter.backends.protocol import Backend
from exporter.backends.types import DeviceInfo, MigInstance, MigProfile, Unsupported
from exporter.executor import SerialExecutor
from exporter.snapshot import Snapshot
from healthd.partition import planner
from healthd.partition.capacity import MIB, CardCapacity, View, card_capacity
from healthd.partition.cdi import CdiWriter, device_name
from healthd.partition.device_calls import MigInUseError, compute_slices, driver, find_instance, placement_of
from healthd.partition.devnodes import HostDevices
from healthd.partition.edits import ContainerEdits, container_edits
from healthd.partition.errors import Kind, PartitionError, exhausted, invalid, not_found, precondition, unavailable
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsError, MpsSupervisor
from healthd.partition.owners import OwnerProbe, process_start_ticks
from healthd.partition.planner import Occupied, Quota
from healthd.partition.sharing import CardSharing, SharingPolicy
from healthd.partition.store import Store
from healthd.rpc.validation import InvalidField, parse_gpu_ref, quote

__all__ = ["CardCapacity", "CreateRequest", "ManagerSettings", "PartitionManager", "View"]

log = structlog.get_logger("partition")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    lease_default_seconds: float = 300.0
    lease_max_seconds: float = 86400.0
    owner_grace_seconds: float = 60.0  # a partition is not reclaimed before its container had time to start
    destroy_retry_seconds: float = 5.0  # how long a delete retries a MIG instance still in use
    creating_timeout_seconds: float = 60.0  # a row still 'creating' this long with no create running is recovered


@dataclass(frozen=True, slots=True)
class CreateRequest:
    owner: Owner
    gpu: str  # index, UUID or "any"
    compute_percent: int
    memory_mib: int
    request_id: str = ""
    lease_ttl_seconds: float = 0.0
    allow_faulty_gpus: bool = False  # "any": also cards whose faults take them out of service

    def fingerprint(self) -> str:
        text = repr((self.owner, self.gpu, self.compute_percent, self.memory_mib, self.lease_ttl_seconds))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def new_partition_id() -> str:
    return "p-" + secrets.token_hex(6)


class PartitionManager:
    def __init__(
        self,
        backend: Backend | GuardedBackend,
        store: Store,
        mps: MpsSupervisor,
        cdi: CdiWriter,
        owners: OwnerProbe,
        *,
        settings: ManagerSettings = ManagerSettings(),
        clock: Callable[[], float],
        new_id: Callable[[], str] = new_partition_id,
        proc_root: Path = Path("/proc"),
        order_any: planner.CardOrder = planner.pick_card,
        snapshot: Callable[[], Snapshot | None] = lambda: None,
        devices: HostDevices | None = None,
        default_sharing: SharingPolicy = SharingPolicy.ISOLATED,
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,  # faulty cards "any" skips
    ) -> None:
        if isinstance(backend, GuardedBackend):
            self.device, self._owns_device = backend, False
        else:
            self.device, self._owns_device = GuardedBackend(DeviceAccess(backend, DeadlineSettings())), True
        self.store = store
        self.mps = mps
        self.cdi = cdi
        self.owners = owners
        self.settings = settings
        self._order_any = order_any
        self._out_of_service = out_of_service
        self.clock = clock
        self._new_id = new_id
        self._proc_root = proc_root
        self._snapshot = snapshot
        self._store_io = SerialExecutor("partition-store")  # SQLite and the CDI file
        self._host_io = SerialExecutor("partition-host")  # MPS control daemons, owner checks (/proc, cgroups)
        self._devices = devices or HostDevices(proc_root)  # device numbers for the CDI spec
        self._infos: list[DeviceInfo] = []
        self._profiles: dict[int, tuple[MigProfile, ...]] = {}
        self._hw_mig: dict[int, bool] = {}
        self._foreign: dict[int, tuple[MigInstance, ...]] = {}
        self._modes: dict[int, CardMode] = {}
        self._default_sharing = default_sharing
        self._sharing: dict[int, SharingPolicy] = {}  # TDM cards' sharing policy
        self._records: dict[str, PartitionRecord] = {}
        self._card_locks: dict[int, asyncio.Lock] = {}
        self._request_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # request id -> (lock, callers holding it)
        self._creating: set[str] = set()  # partition ids whose create is running now
        self._tasks: set[asyncio.Task[Any]] = set()
        self.reclaimed_total = 0
        self.ready = False  # start() has learned the cards and recovered the stored partitions
        self.reconcile_failures: Counter[str] = Counter()  # "gpu N" or "mps" -> passes that failed there
        self._view = View(partitions=(), cards=())

    # ----- start, recovery and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the cards, then make stored state, MPS daemons and MIG instances agree again."""
        count = await driver(self.device.aio.device_count())
        self._infos = [await driver(self.device.aio.device_info(i)) for i in range(count)]
        self._card_locks = {i: asyncio.Lock() for i in range(count)}
        stored = await self._store(self.store.card_modes)
        self._modes = {info.index: stored.get(info.uuid, (CardMode.NONE, ""))[0] for info in self._infos}
        self._sharing = {
            info.index: SharingPolicy(stored[info.uuid][1] or SharingPolicy.ISOLATED)
            for info in self._infos
            if info.uuid in stored and stored[info.uuid][0] is CardMode.TDM
        }
        self._records = {r.id: r for r in await self._store(self.store.all)}
        for info in self._infos:
            try:
                await self._refresh_hardware(info.index)
            except PartitionError as exc:
                log.warning("cannot read card", gpu=info.index, error=exc.message)
                self._hw_mig.setdefault(info.index, False)
                self._profiles.setdefault(info.index, ())
                self._foreign.setdefault(info.index, ())
        for record in list(self._records.values()):
            try:
                await self._recover(record)
            except PartitionError as exc:  # a hung card: its rows wait for the reconciler
                log.error("cannot recover partition yet", partition=record.id, gpu=record.gpu, error=exc.message)
        await self._write_cdi()
        self._publish()
        self.ready = True
        log.info("partitions ready", partitions=len(self._records), mps=self.mps.control.name)

    async def settle(self, grace_seconds: float) -> bool:
        """Wait (at most ``grace_seconds``) for creates still running, also those whose caller went away."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_seconds)
        return not self._tasks

    async def close(self, grace_seconds: float = 2.0) -> None:
        """Give running creates ``grace_seconds`` to finish, close the store after its queued writes, stop the
        executors (their threads are daemons: a stuck one never holds up the process's exit)."""
        await self.settle(grace_seconds)
        closed = asyncio.wrap_future(self._store_io.submit(self.store.close))
        await asyncio.wait({closed}, timeout=grace_seconds)
        self._store_io.shutdown(wait=False)
        self._host_io.shutdown(wait=False)
        if self._owns_device:
            self.device.access.shutdown(0.0)

    async def _refresh_hardware(self, gpu: int) -> None:
        """MIG mode from the latest sample of the card (or one read when there is none), then its profiles."""
        hung = self.device.access.hung_cards().get(gpu)
        if hung is not None:
            raise unavailable(f"GPU {gpu} is not answering: {hung.describe(self.device.access.now())}")
        snap = self._snapshot()
        card = snap.gpu(gpu) if snap is not None else None
        if card is not None and card.fresh and card.sample is not None:
            mig_on = card.sample.mig_mode_current is True
        elif card is not None and card.info is not None and not card.fresh:
            raise unavailable(f"GPU {gpu} cannot be read: {card.error or 'no fresh sample'}")
        else:
            mig_on = (await driver(self.device.aio.sample(gpu))).mig_mode_current is True
        if mig_on and not self._profiles.get(gpu):
            self._profiles[gpu] = await driver(self.device.aio.mig_profiles(gpu))
        elif not mig_on:
            self._profiles[gpu] = ()
        if gpu in self._hw_mig and self._hw_mig[gpu] != mig_on:  # NVIDIA: minors may change with MIG mode
            self._infos[gpu] = await driver(self.device.aio.device_info(gpu))
        self._hw_mig[gpu] = mig_on
        if mig_on:
            await self._refresh_foreign(gpu)
        else:
            self._foreign[gpu] = ()

    async def _refresh_foreign(self, gpu: int) -> tuple[MigInstance, ...]:
        instances = await driver(self.device.aio.mig_instances(gpu))
        ours = {r.mig.gpu_instance_id for r in self._records.values() if r.gpu == gpu and r.mig and r.mig.uuid}
        pending = [r.mig for r in self._records.values() if r.gpu == gpu and r.mig and not r.mig.uuid]
        foreign = tuple(
            i
            for i in instances
            if i.gpu_instance_id not in ours
            and not any(p.profile_id == i.profile_id and p.placement_start == i.placement_start for p in pending)
        )
        if foreign != self._foreign.get(gpu, ()):
            for inst in foreign:
                log.warning(
                    "foreign MIG instance (not ours; left alone)",
                    gpu=gpu,
                    gpu_instance_id=inst.gpu_instance_id,
                    profile=inst.profile_name,
                    placement_start=inst.placement_start,
                )
        self._foreign[gpu] = foreign
        self._publish()
        return instances

    async def _recover(self, record: PartitionRecord) -> None:
        """Finish or undo a row after a restart, or a create that did not finish in time."""
        gpu = record.gpu
        if gpu >= len(self._infos) or self._infos[gpu].uuid != record.gpu_uuid:
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
                await self._save(replace(record, state=State.READY))
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
        await self._save(replace(record, state=State.READY, mig=placement_of(match)))
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
                return self._capacity(gpu)
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
                    f"GPU {gpu} does not have MIG mode enabled in hardware; as root, with the card idle, run "
                    f"`nvidia-smi -i {gpu} -mig 1` (a GPU reset may be needed), then retry"
                )
            if mode is CardMode.MIG and not self._profiles[gpu]:
                raise precondition(f"GPU {gpu} reports no MIG profiles")
            if mode is CardMode.TDM and self._hw_mig[gpu]:
                raise precondition(
                    f"GPU {gpu} has MIG mode enabled in hardware; TDM needs the whole card: run "
                    f"`nvidia-smi -i {gpu} -mig 0` (with no MIG instances left), then retry"
                )
            await self._store(self.store.set_card_mode, self._infos[gpu].uuid, mode, str(policy or ""))
            self._modes[gpu] = mode
            if policy is None:
                self._sharing.pop(gpu, None)
            else:
                self._sharing[gpu] = policy
            self._publish()
            log.info("card mode set", gpu=gpu, mode=str(mode), previous=str(current), sharing=str(policy or ""))
            return self._capacity(gpu)

    # ----- create ------------------------------------------------------------------------------------------

    async def create(self, request: CreateRequest) -> PartitionRecord:
        request.owner.validate()
        if request.compute_percent < 0 or request.compute_percent > 100:
            raise invalid(f"compute_percent: must be 1-100 or 0 for no limit, got {request.compute_percent}")
        if request.request_id and (len(request.request_id) > 128 or not request.request_id.isprintable()):
            raise invalid("request_id: expected at most 128 printable characters")
        if request.lease_ttl_seconds < 0 or request.lease_ttl_seconds > self.settings.lease_max_seconds:
            raise invalid(f"owner.lease.ttl_seconds: must be 0-{self.settings.lease_max_seconds:g}")
        if request.owner.kind is not OwnerKind.LEASE and request.lease_ttl_seconds:
            raise invalid("ttl_seconds applies only to lease owners")
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
                    return existing
                return await self._create(request)
        finally:
            lock, users = self._request_locks[rid]
            if users == 1:
                del self._request_locks[rid]
            else:
                self._request_locks[rid] = (lock, users - 1)

    async def _create(self, request: CreateRequest) -> PartitionRecord:
        owner = request.owner
        if owner.kind is OwnerKind.PROCESS:
            ticks = await self._host(process_start_ticks, self._proc_root, owner.pid)
            if ticks is None:
                raise precondition(f"owner.process.pid: no process {owner.pid}")
            owner = replace(owner, pid_start_ticks=ticks)
        request = replace(request, owner=owner)
        quota = Quota(request.compute_percent, request.memory_mib)
        if request.gpu.strip().lower() == "any":
            return await self._create_any(request, quota)
        gpu = self.resolve_gpu(request.gpu)
        async with self._card_locks[gpu]:
            return await self._create_on(gpu, request, quota)

    async def _create_any(self, request: CreateRequest, quota: Quota) -> PartitionRecord:
        candidates = [
            (c.gpu, Quota(100 - c.compute_percent_allocated, c.memory_total_mib - c.memory_allocated_mib))
            for c in (self._capacity(i) for i in range(len(self._infos)))
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
        for gpu in self._order_any(candidates, quota):
            async with self._card_locks[gpu]:
                try:
                    return await self._create_on(gpu, request, quota)
                except PartitionError as exc:
                    if exc.kind not in (Kind.EXHAUSTED, Kind.INVALID, Kind.UNAVAILABLE):
                        raise
                    last = exc
        assert last is not None
        raise exhausted(f"no card can hold the request: {last.message}")

    async def _create_on(self, gpu: int, request: CreateRequest, quota: Quota) -> PartitionRecord:
        mode = self._modes[gpu]
        info = self._infos[gpu]
        if mode is CardMode.NONE:
            raise precondition(f"GPU {gpu} is not partitionable (mode none); set its mode to tdm or mig first")
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
            request_fingerprint=request.fingerprint() if request.request_id else "",
        )
        if mode is CardMode.TDM:
            on_card = [r for r in self._records.values() if r.gpu == gpu]
            planner.admit_tdm(
                (Quota(r.compute_percent, r.memory_mib) for r in on_card), quota, info.memory_total_bytes // MIB
            )
            record = await self._start_tdm(record)
        else:
            record = await self._start_mig(gpu, record, quota)
        await self._write_cdi()
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
            await self._save(record)
            return record
        finally:
            self._creating.discard(record.id)

    async def _start_mig(self, gpu: int, record: PartitionRecord, quota: Quota) -> PartitionRecord:
        instances = await self._refresh_foreign(gpu)
        profiles = self._profiles[gpu]
        occupied = [
            Occupied(i.profile_id, i.placement_start, i.placement_size, compute_slices(profiles, i)) for i in instances
        ]
        # creates that passed their deadline may still make their instance: their placement stays taken
        slices = {p.profile_id: p.slice_count for p in profiles}
        occupied += [
            Occupied(r.mig.profile_id, r.mig.placement_start, r.mig.placement_size, slices.get(r.mig.profile_id, 0))
            for r in self._records.values()
            if r.gpu == gpu
            and r.mig is not None
            and not r.mig.uuid
            and not any(i.placement_start == r.mig.placement_start for i in instances)
        ]
        choice = planner.choose_mig(self._profiles[gpu], occupied, quota)
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
                    # Still in the driver, which may yet make it: keep the row (and its placement) 'creating'; the
                    # reconciler adopts the instance once the card answers, or drops the row if none appeared.
                    log.warning("MIG create passed its deadline; the partition stays creating", partition=record.id)
                    raise unavailable(
                        f"{exc.message}; partition {record.id} stays 'creating' until the card answers, then it "
                        "is adopted or removed"
                    ) from None
            record = replace(record, state=State.READY, mig=placement_of(inst))
            await self._save(record)
            return record
        finally:
            self._creating.discard(record.id)

    # ----- reads -------------------------------------------------------------------------------------------

    def get(self, partition_id: str) -> PartitionRecord:
        record = self._records.get(partition_id)
        if record is None:
            raise not_found(f"no partition {quote(partition_id)}")
        return record

    def list_partitions(self, gpu_ref: str = "") -> list[PartitionRecord]:
        records = sorted(self._records.values(), key=lambda r: (r.created_at, r.id))
        if gpu_ref:
            gpu = self.resolve_gpu(gpu_ref)
            records = [r for r in records if r.gpu == gpu]
        return records

    def capacity(self, gpu_ref: str = "") -> list[CardCapacity]:
        if gpu_ref:
            return [self._capacity(self.resolve_gpu(gpu_ref))]
        return [self._capacity(i) for i in range(len(self._infos))]

    def view(self) -> View:
        """The last published picture; safe to read from any thread (metrics scrapes run in the HTTP thread)."""
        return self._view

    def _publish(self) -> None:
        self._view = View(
            partitions=tuple(sorted(self._records.values(), key=lambda r: r.id)),
            cards=tuple(self._capacity(i) for i in range(len(self._infos))),
        )

    def edits(self, record: PartitionRecord) -> ContainerEdits:
        minor = self._infos[record.gpu].minor_number
        pipe = self._card_sharing(record.gpu).daemon(record).pipe_dir if record.mode is CardMode.TDM else None
        return container_edits(
            record,
            gpu_minor=record.gpu if isinstance(minor, Unsupported) else minor,
            pipe_dir=pipe,
            devices=self._devices,
        )

    def cdi_name(self, record: PartitionRecord) -> str:
        return device_name(record.id)

    def _capacity(self, gpu: int) -> CardCapacity:
        return card_capacity(
            self._infos[gpu],
            [r for r in self._records.values() if r.gpu == gpu],
            self._modes[gpu],
            self._profiles.get(gpu, ()),
            self._foreign.get(gpu, ()),
            self._hw_mig.get(gpu, False),
            str(self._sharing.get(gpu, "")),
        )

    # ----- delete, leases, reclaim -------------------------------------------------------------------------

    async def delete(self, partition_id: str) -> bool:
        record = self._records.get(partition_id)
        if record is None:
            return False
        async with self._card_locks[record.gpu]:
            record = self._records.get(partition_id)
            if record is None:
                return False
            await self._teardown(record, retry_s=self.settings.destroy_retry_seconds, raise_in_use=True)
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
        record = self.get(partition_id)
        if record.owner.kind is not OwnerKind.LEASE:
            raise precondition(f"partition {partition_id} is owned by {record.owner.describe()}, not a lease")
        if ttl_seconds < 0 or ttl_seconds > self.settings.lease_max_seconds:
            raise invalid(f"ttl_seconds: must be 0-{self.settings.lease_max_seconds:g}")
        if record.state is not State.READY or self.clock() >= record.lease_expires_at:
            raise precondition(f"partition {partition_id}: lease expired; it is being reclaimed")
        record = replace(record, lease_expires_at=self.clock() + (ttl_seconds or self.settings.lease_default_seconds))
        await self._save(record)
        return record

    async def reconcile(self) -> list[str]:
        """One pass, card by card: finish deletes and stale creates, reclaim partitions whose owner is gone,
        look for foreign MIG instances; then restart dead MPS daemons. A card that fails is counted and skipped."""
        reclaimed: list[str] = []
        for gpu in range(len(self._infos)):
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
                stale = now - record.created_at >= self.settings.creating_timeout_seconds
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

    # ----- helpers -----------------------------------------------------------------------------------------

    def resolve_gpu(self, ref: str) -> int:
        try:
            parsed = parse_gpu_ref(ref)  # ASCII digits only: "٣" is not GPU 3
        except InvalidField as exc:
            raise invalid(str(exc)) from None
        if parsed.index is not None:
            if parsed.index >= len(self._infos):
                raise not_found(f"gpu: no GPU {parsed.index} (this node has {len(self._infos)})")
            return parsed.index
        for info in self._infos:
            if info.uuid.lower() == parsed.uuid.lower():
                return info.index
        raise not_found(f"gpu: no GPU with UUID {quote(parsed.uuid)}")

    def _card_sharing(self, gpu: int) -> CardSharing:
        return CardSharing(self._sharing.get(gpu, self._default_sharing), self.mps)

    async def _store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._store_io, fn, *args)

    async def _host(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._host_io, fn, *args)

    async def _insert(self, record: PartitionRecord) -> None:
        try:
            await self._store(self.store.insert, record)
        except sqlite3.IntegrityError as exc:
            raise PartitionError(Kind.CONFLICT, f"partition {record.id} or its request_id exists already") from exc
        self._records[record.id] = record
        self._publish()

    async def _save(self, record: PartitionRecord) -> None:
        await self._store(self.store.update, record)
        self._records[record.id] = record
        self._publish()

    async def _forget(self, partition_id: str) -> None:
        await self._store(self.store.delete, partition_id)
        self._records.pop(partition_id, None)
        self._publish()

    async def _write_cdi(self) -> None:
        ready = [r for r in self._records.values() if r.state is State.READY]

        def write() -> None:
            try:
                self.cdi.write((r.id, self.edits(r)) for r in ready)
            except OSError as exc:
                log.error("cannot write CDI spec", path=str(self.cdi.path), error=str(exc))

        await self._store(write)

    async def rebind(self, partition_id: str, owner: Owner) -> PartitionRecord:
        """Give a ready partition a new owner (a kubelet device's lease becomes its pod); the lease ends with it."""
        owner.validate()
        gpu = self.get(partition_id).gpu
        async with self._card_locks[gpu]:
            record = self.get(partition_id)
            if record.state is not State.READY:
                raise precondition(f"partition {partition_id} is {record.state}; only a ready partition changes owner")
            expires = record.lease_expires_at if owner.kind is OwnerKind.LEASE else 0.0
            record = replace(record, owner=owner, lease_expires_at=expires)
            await self._store(self.store.set_owner, record)
            self._records[record.id] = record
            self._publish()
            log.info("partition owner changed", partition=record.id, owner=owner.describe())
            return record

    @property
    def cards(self) -> tuple[DeviceInfo, ...]:
        """The cards learned at start (empty before)."""
        return tuple(self._infos)
