"""The partition manager: rules, per-card locks, MPS and MIG actions, state, CDI and owner reclaim.

Every change follows intent -> action -> result: the row is committed as ``creating``/``deleting`` before the GPU
or MPS is touched, so a restart after kill -9 can finish or undo what was in flight (``recover``).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from exporter.backends.errors import BackendError, InsufficientResourcesError, InUseError
from exporter.backends.protocol import Backend
from exporter.backends.types import DeviceInfo, MigInstance, MigProfile, Unsupported
from healthd.partition import planner
from healthd.partition.cdi import CdiWriter, device_name
from healthd.partition.edits import ContainerEdits, container_edits
from healthd.partition.errors import Kind, PartitionError, exhausted, invalid, not_found, precondition, unavailable
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsDaemonSpec, MpsError, MpsSupervisor
from healthd.partition.owners import OwnerProbe, process_start_ticks
from healthd.partition.planner import Occupied, Quota
from healthd.partition.store import Store

log = structlog.get_logger("partition")
T = TypeVar("T")
MIB = 2**20


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    lease_default_seconds: float = 300.0
    lease_max_seconds: float = 86400.0
    owner_grace_seconds: float = 60.0  # a partition is not reclaimed before its container had time to start
    backend_deadline_seconds: float = 10.0
    destroy_retry_seconds: float = 5.0  # how long a delete retries a MIG instance still in use


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


@dataclass(frozen=True, slots=True)
class CardCapacity:
    gpu: int
    gpu_uuid: str
    mode: CardMode
    partitions: int
    compute_percent_allocated: int
    memory_allocated_mib: int
    memory_total_mib: int
    mig_memory_slices_free: int
    foreign: tuple[MigInstance, ...]
    hardware_mig: bool
    mig_room: tuple[tuple[MigProfile, int], ...] = ()  # MIG mode: (profile, how many more fit now)


@dataclass(frozen=True, slots=True)
class View:
    """An immutable picture for metrics and reads."""

    partitions: tuple[PartitionRecord, ...]
    cards: tuple[CardCapacity, ...]


def new_partition_id() -> str:
    return "p-" + secrets.token_hex(6)


class PartitionManager:
    def __init__(
        self,
        backend: Backend,
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
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,  # faulty cards "any" skips
    ) -> None:
        self.backend = backend
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
        self._infos: list[DeviceInfo] = []
        self._profiles: dict[int, tuple[MigProfile, ...]] = {}
        self._hw_mig: dict[int, bool] = {}
        self._foreign: dict[int, tuple[MigInstance, ...]] = {}
        self._modes: dict[int, CardMode] = {}
        self._records: dict[str, PartitionRecord] = {}
        self._card_locks: dict[int, asyncio.Lock] = {}
        self._request_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # request id -> (lock, callers holding it)
        self.reclaimed_total = 0
        self._view = View(partitions=(), cards=())

    # ----- start and recovery ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the cards, then make stored state, MPS daemons and MIG instances agree again."""
        count = await self._call(self.backend.device_count)
        self._infos = [await self._call(self.backend.device_info, i) for i in range(count)]
        self._card_locks = {i: asyncio.Lock() for i in range(count)}
        stored_modes = self.store.card_modes()
        self._modes = {info.index: stored_modes.get(info.uuid, CardMode.NONE) for info in self._infos}
        self._records = {r.id: r for r in self.store.all()}
        for info in self._infos:
            await self._refresh_hardware(info.index)
        for record in list(self._records.values()):
            await self._recover(record)
        self._write_cdi()
        self._publish()
        log.info("partitions ready", partitions=len(self._records), mps=self.mps.control.name)

    async def _refresh_hardware(self, gpu: int) -> None:
        try:
            sample = await self._call(self.backend.sample, gpu)
            self._hw_mig[gpu] = sample.mig_mode_current is True
            self._profiles[gpu] = await self._call(self.backend.mig_profiles, gpu) if self._hw_mig[gpu] else ()
        except PartitionError as exc:
            log.warning("cannot read card", gpu=gpu, error=exc.message)
            self._hw_mig.setdefault(gpu, False)
            self._profiles.setdefault(gpu, ())
        if self._hw_mig[gpu]:
            await self._refresh_foreign(gpu)
        else:
            self._foreign[gpu] = ()

    async def _refresh_foreign(self, gpu: int) -> tuple[MigInstance, ...]:
        instances = await self._call(self.backend.mig_instances, gpu)
        ours = {r.mig.gpu_instance_id for r in self._records.values() if r.gpu == gpu and r.mig and r.mig.uuid}
        foreign = tuple(i for i in instances if i.gpu_instance_id not in ours)
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
        gpu = record.gpu
        if gpu >= len(self._infos) or self._infos[gpu].uuid != record.gpu_uuid:
            log.error("partition's card is gone; dropping it", partition=record.id, gpu_uuid=record.gpu_uuid)
            self._forget(record.id)
            return
        if record.state is State.DELETING:
            await self._teardown(record, retry_s=0.0, raise_in_use=False)
            return
        if record.mode is CardMode.TDM:
            try:
                await asyncio.to_thread(self.mps.ensure, self._mps_spec(record))
            except MpsError as exc:
                log.error("cannot start MPS for stored partition; will retry", partition=record.id, error=str(exc))
            if record.state is State.CREATING:
                self._save(replace(record, state=State.READY))
            return
        # MIG: adopt our instance, or drop the row if the instance is gone (or was never made)
        assert record.mig is not None
        instances = await self._call(self.backend.mig_instances, gpu) if self._hw_mig.get(gpu) else ()
        claimed = {r.mig.gpu_instance_id for r in self._records.values() if r.id != record.id and r.mig and r.mig.uuid}
        match = _find_instance(instances, record.mig, claimed)
        if match is None:
            log.error("MIG instance of partition is gone; dropping it", partition=record.id, gpu=gpu)
            self._forget(record.id)
            return
        self._save(replace(record, state=State.READY, mig=_placement_of(match)))
        log.info("adopted MIG instance", partition=record.id, gpu=gpu, gpu_instance_id=match.gpu_instance_id)
        await self._refresh_foreign(gpu)

    # ----- card mode ---------------------------------------------------------------------------------------

    async def set_mode(self, gpu_ref: str, mode: CardMode) -> CardCapacity:
        gpu = self.resolve_gpu(gpu_ref)
        async with self._card_locks[gpu]:
            current = self._modes[gpu]
            if mode is current:
                return self._capacity(gpu)
            on_card = [r for r in self._records.values() if r.gpu == gpu]
            if on_card:
                raise precondition(
                    f"GPU {gpu} is in mode {current} with {len(on_card)} partition(s); delete them before changing mode"
                )
            await self._refresh_hardware(gpu)
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
            self.store.set_card_mode(self._infos[gpu].uuid, mode)
            self._modes[gpu] = mode
            self._publish()
            log.info("card mode set", gpu=gpu, mode=str(mode), previous=str(current))
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
        if not request.request_id:
            return await self._create(request)
        rid = request.request_id
        lock, users = self._request_locks.get(rid, (asyncio.Lock(), 0))
        self._request_locks[rid] = (lock, users + 1)
        try:
            async with lock:
                existing = self.store.by_request_id(request.request_id)
                if existing is not None:
                    if existing.request_fingerprint != request.fingerprint():
                        raise PartitionError(
                            Kind.CONFLICT,
                            f"request_id {request.request_id!r} was used for a different request (partition "
                            f"{existing.id})",
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
            ticks = process_start_ticks(self._proc_root, owner.pid)
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
        faulty = set() if request.allow_faulty_gpus else self._out_of_service()
        if all(gpu in faulty for gpu, _ in candidates):
            listed = ", ".join(str(gpu) for gpu, _ in candidates)
            raise exhausted(f"every partitionable card has a fault that takes it out of service (GPU {listed})")
        candidates = [c for c in candidates if c[0] not in faulty]
        last: PartitionError | None = None
        for gpu in self._order_any(candidates, quota):
            async with self._card_locks[gpu]:
                try:
                    return await self._create_on(gpu, request, quota)
                except PartitionError as exc:
                    if exc.kind is not Kind.EXHAUSTED and exc.kind is not Kind.INVALID:
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
            self._insert(record)
            try:
                await asyncio.to_thread(self.mps.ensure, self._mps_spec(record))
            except MpsError as exc:
                self._forget(record.id)
                raise unavailable(f"MPS control daemon for GPU {gpu} did not start: {exc}") from exc
            record = replace(record, state=State.READY)
        else:
            instances = await self._refresh_foreign(gpu)
            occupied = [
                Occupied(i.profile_id, i.placement_start, i.placement_size, _compute_slices(self._profiles[gpu], i))
                for i in instances
            ]
            choice = planner.choose_mig(self._profiles[gpu], occupied, quota)
            record = replace(
                record,
                mig=MigPlacement(choice.profile.profile_id, choice.profile.name, choice.start, choice.size),
            )
            self._insert(record)
            try:
                inst = await self._call(self.backend.create_mig_instance, gpu, choice.profile.profile_id, choice.start)
            except PartitionError:
                self._forget(record.id)
                raise
            record = replace(record, state=State.READY, mig=_placement_of(inst))
        self._save(record)
        self._write_cdi()
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

    # ----- reads -------------------------------------------------------------------------------------------

    def get(self, partition_id: str) -> PartitionRecord:
        record = self._records.get(partition_id)
        if record is None:
            raise not_found(f"no partition {partition_id!r}")
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
        pipe = self._mps_spec(record).pipe_dir if record.mode is CardMode.TDM else None
        return container_edits(
            record,
            gpu_minor=record.gpu if isinstance(minor, Unsupported) else minor,
            pipe_dir=pipe,
            proc_root=self._proc_root,
        )

    def cdi_name(self, record: PartitionRecord) -> str:
        return device_name(record.id)

    def _capacity(self, gpu: int) -> CardCapacity:
        info = self._infos[gpu]
        ours = [r for r in self._records.values() if r.gpu == gpu]
        mode = self._modes[gpu]
        profiles = self._profiles.get(gpu, ())
        foreign = self._foreign.get(gpu, ())
        total_mib = info.memory_total_bytes // MIB
        if mode is CardMode.MIG and profiles:
            by_id = {p.profile_id: p for p in profiles}
            total_sm = planner.card_sm_count(profiles)
            sms = sum(by_id[r.mig.profile_id].sm_count for r in ours if r.mig and r.mig.profile_id in by_id)
            memory = sum(by_id[r.mig.profile_id].memory_mib for r in ours if r.mig and r.mig.profile_id in by_id)
            used_slices = {
                s
                for start, size in [(r.mig.placement_start, r.mig.placement_size) for r in ours if r.mig]
                + [(i.placement_start, i.placement_size) for i in foreign]
                for s in range(start, start + size)
            }
            slices_free = planner.card_memory_slices(profiles) - len(used_slices)
            compute = sms * 100 // total_sm if total_sm else 0
            occupied = [
                Occupied(
                    r.mig.profile_id, r.mig.placement_start, r.mig.placement_size, by_id[r.mig.profile_id].slice_count
                )
                for r in ours
                if r.mig and r.mig.profile_id in by_id
            ] + [
                Occupied(i.profile_id, i.placement_start, i.placement_size, _compute_slices(profiles, i))
                for i in foreign
            ]
            room = planner.profile_room(profiles, occupied)
        else:
            compute = sum(r.compute_percent for r in ours)
            memory = sum(r.memory_mib for r in ours)
            slices_free = 0
            room = ()
        return CardCapacity(
            gpu=gpu,
            gpu_uuid=info.uuid,
            mode=mode,
            partitions=len(ours),
            compute_percent_allocated=compute,
            memory_allocated_mib=memory,
            memory_total_mib=total_mib,
            mig_memory_slices_free=slices_free,
            foreign=foreign,
            hardware_mig=self._hw_mig.get(gpu, False),
            mig_room=room,
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
            self._save(record)
            self._write_cdi()  # no new container gets a partition that is going away
        if record.mode is CardMode.TDM:
            await asyncio.to_thread(self.mps.release, self._mps_spec(record))
        elif record.mig and record.mig.uuid:
            deadline = self.clock() + retry_s
            delay = 0.05
            while True:
                try:
                    await self._call(self.backend.destroy_mig_instance, record.gpu, record.mig.gpu_instance_id)
                    break
                except _InUseError as exc:
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
        self._forget(record.id)
        self._write_cdi()
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
        self._save(record)
        return record

    async def reconcile(self) -> list[str]:
        """One pass: reclaim partitions whose owner is gone, finish pending deletes, restart dead MPS daemons."""
        reclaimed = []
        now = self.clock()
        for record in list(self._records.values()):
            if record.state is State.DELETING:
                async with self._card_locks[record.gpu]:
                    current = self._records.get(record.id)
                    if current is not None and await self._teardown(current, retry_s=0.0, raise_in_use=False):
                        reclaimed.append(record.id)
                continue
            if record.state is not State.READY:
                continue
            if record.owner.kind is not OwnerKind.LEASE and now - record.created_at < self.settings.owner_grace_seconds:
                continue
            alive = await asyncio.to_thread(self.owners.alive, record.owner, record.lease_expires_at)
            if alive is not False:
                continue
            log.info("owner gone; reclaiming partition", partition=record.id, owner=record.owner.describe())
            async with self._card_locks[record.gpu]:
                current = self._records.get(record.id)
                if current != record:
                    continue  # deleted or changed (a lease renewed) since the check: look again next pass
                try:
                    done = await self._teardown(current, retry_s=0.0, raise_in_use=False)
                except PartitionError as exc:
                    log.error("reclaim failed", partition=record.id, error=exc.message)
                    continue
                if done:
                    self.reclaimed_total += 1
                    reclaimed.append(record.id)
        await asyncio.to_thread(self.mps.check)
        for gpu, mode in self._modes.items():
            if mode is CardMode.MIG:
                async with self._card_locks[gpu]:
                    try:
                        await self._refresh_foreign(gpu)  # an operator may have made or removed instances
                    except PartitionError as exc:
                        log.warning("cannot list MIG instances", gpu=gpu, error=exc.message)
        return reclaimed

    # ----- helpers -----------------------------------------------------------------------------------------

    def resolve_gpu(self, ref: str) -> int:
        ref = ref.strip()
        if not ref:
            raise invalid("gpu: give a GPU index, a GPU UUID, or 'any'")
        if ref.isdigit():
            index = int(ref)
            if index >= len(self._infos):
                raise not_found(f"gpu: no GPU {index} (this node has {len(self._infos)})")
            return index
        for info in self._infos:
            if info.uuid == ref:
                return info.index
        raise not_found(f"gpu: no GPU with UUID {ref!r}")

    def _mps_spec(self, record: PartitionRecord) -> MpsDaemonSpec:
        return self.mps.spec_for(record.id, record.gpu_uuid, record.compute_percent, record.memory_mib)

    def _insert(self, record: PartitionRecord) -> None:
        try:
            self.store.insert(record)
        except sqlite3.IntegrityError as exc:
            raise PartitionError(Kind.CONFLICT, f"partition {record.id} or its request_id exists already") from exc
        self._records[record.id] = record
        self._publish()

    def _save(self, record: PartitionRecord) -> None:
        self.store.update(record)
        self._records[record.id] = record
        self._publish()

    def _forget(self, partition_id: str) -> None:
        self.store.delete(partition_id)
        self._records.pop(partition_id, None)
        self._publish()

    def _write_cdi(self) -> None:
        ready = [r for r in self._records.values() if r.state is State.READY]
        try:
            self.cdi.write((r.id, self.edits(r)) for r in ready)
        except OSError as exc:
            log.error("cannot write CDI spec", path=str(self.cdi.path), error=str(exc))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """A backend call off the event loop with a deadline; driver errors become PartitionErrors."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), self.settings.backend_deadline_seconds)
        except TimeoutError:
            name = getattr(fn, "__name__", "call")
            raise unavailable(
                f"GPU driver call {name} did not answer within {self.settings.backend_deadline_seconds:g}s"
            ) from None
        except InUseError as exc:
            raise _InUseError(str(exc)) from exc
        except InsufficientResourcesError as exc:
            raise exhausted(f"the GPU refused: {exc}") from exc
        except BackendError as exc:
            if exc.code == "not_found":
                raise not_found(str(exc)) from exc
            raise unavailable(f"GPU driver call failed: {exc}") from exc

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
            self.store.set_owner(record)
            self._records[record.id] = record
            self._publish()
            log.info("partition owner changed", partition=record.id, owner=owner.describe())
            return record

    @property
    def cards(self) -> tuple[DeviceInfo, ...]:
        """The cards learned at start (empty before)."""
        return tuple(self._infos)


class _InUseError(PartitionError):
    def __init__(self, message: str) -> None:
        super().__init__(Kind.PRECONDITION, message)


def _find_instance(instances: Sequence[MigInstance], mig: MigPlacement, claimed: set[int]) -> MigInstance | None:
    for inst in instances:
        if inst.gpu_instance_id in claimed:
            continue
        if mig.uuid and inst.uuid == mig.uuid:
            return inst
        same_place = inst.profile_id == mig.profile_id and inst.placement_start == mig.placement_start
        if same_place and (not mig.uuid or inst.gpu_instance_id == mig.gpu_instance_id):
            return inst
    return None


def _placement_of(inst: MigInstance) -> MigPlacement:
    return MigPlacement(
        profile_id=inst.profile_id,
        profile_name=inst.profile_name,
        placement_start=inst.placement_start,
        placement_size=inst.placement_size,
        gpu_instance_id=inst.gpu_instance_id,
        compute_instance_id=inst.compute_instance_id,
        uuid=inst.uuid,
    )


def _compute_slices(profiles: Sequence[MigProfile], inst: MigInstance) -> int:
    by_id = {p.profile_id: p.slice_count for p in profiles}
    return by_id.get(inst.profile_id, 0)
