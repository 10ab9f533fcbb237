"""What the partition manager knows: the cards (modes, MIG profiles, foreign instances), the partition rows and
the published view, kept in memory and mirrored to the store and the CDI spec on their own executors.

Reads answer from memory; every write goes to SQLite first (``_insert``/``_save``/``_forget``), then to
memory, then to the view that metrics and the API read. healthd/partition/manager.py changes it.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import structlog

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.backends.types import DeviceInfo, MigInstance, MigProfile, Unsupported
from exporter.executor import SerialExecutor
from exporter.sampler import SamplerSettings
from exporter.snapshot import Snapshot
from healthd.host.devices import HostDevices
from healthd.partition import planner
from healthd.partition.capacity import CardCapacity, View, card_capacity
from healthd.partition.cdi import CdiWriter, device_name
from healthd.partition.clock_steps import ClockSteps
from healthd.partition.device_calls import driver
from healthd.partition.edits import ContainerEdits, container_edits
from healthd.partition.errors import Kind, PartitionError, invalid, not_found, unavailable
from healthd.partition.model import CardMode, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsSupervisor
from healthd.partition.owners import OwnerProbe
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import CardSharing, SharingPolicy
from healthd.partition.store import Store
from healthd.rpc.validation import InvalidField, parse_gpu_ref, quote

__all__ = ["PartitionLedger", "new_partition_id"]

log = structlog.get_logger("partition")
T = TypeVar("T")
P = ParamSpec("P")


def new_partition_id() -> str:
    return "p-" + secrets.token_hex(6)


class PartitionLedger:
    def __init__(
        self,
        backend: Backend | GuardedBackend,
        store: Store,
        mps: MpsSupervisor,
        cdi: CdiWriter,
        owners: OwnerProbe,
        *,
        settings: PartitionSettings | None = None,
        clock: Callable[[], float],
        new_id: Callable[[], str] = new_partition_id,
        proc_root: Path = Path("/proc"),
        order_any: planner.CardOrder = planner.pick_card,
        snapshot: Callable[[], Snapshot | None] = lambda: None,
        devices: HostDevices | None = None,
        default_sharing: SharingPolicy = SharingPolicy.ISOLATED,
        out_of_service: Callable[[], AbstractSet[int]] = frozenset,  # faulty cards "any" skips
        destroy_retry_seconds: float = 5.0,  # how long a delete retries a MIG instance still in use
        creating_timeout_seconds: float = 60.0,  # a row still 'creating' this long with no create running is recovered
        monotonic: Callable[[], float] | None = None,  # against which wall-clock steps are seen (default: see below)
        partition_hook: str | None = None,  # xpu-cdi-hook: each partition's CDI device refuses a second partition
    ) -> None:
        if isinstance(backend, GuardedBackend):
            self.device, self._owns_device = backend, False
        else:
            self.device, self._owns_device = GuardedBackend(DeviceAccess(backend, SamplerSettings())), True
        self.store = store
        self.mps = mps
        self.cdi = cdi
        self.owners = owners
        self.settings = settings or PartitionSettings()
        self.destroy_retry_seconds = destroy_retry_seconds
        self.creating_timeout_seconds = creating_timeout_seconds
        self._order_any = order_any
        self._out_of_service = out_of_service
        self.clock = clock
        self._partition_hook = partition_hook
        # the real wall clock is watched for steps; an injected (test) clock has no monotonic twin unless given one
        self._clock_steps = ClockSteps(clock, monotonic or (time.monotonic if clock is time.time else clock))
        self._new_id = new_id
        self._proc_root = proc_root
        self._snapshot = snapshot
        self._store_io = SerialExecutor("partition-store")  # SQLite and the CDI file
        self._host_io = SerialExecutor("partition-host")  # MPS control daemons, owner checks (/proc, cgroups)
        self._devices = devices or HostDevices(proc_root)  # device numbers for the CDI spec
        self._count = 0  # cards the driver reports
        self._infos: dict[int, DeviceInfo] = {}  # the cards that have answered (joined); the others wait
        self._unanswered: dict[int, str] = {}  # card -> why it has not joined yet (hung, lost, failing)
        self._profiles: dict[int, tuple[MigProfile, ...]] = {}
        self._hw_mig: dict[int, bool] = {}
        self._foreign: dict[int, tuple[MigInstance, ...]] = {}
        self._modes: dict[int, CardMode] = {}
        self._stored_modes: dict[str, tuple[CardMode, str]] = {}  # card UUID -> (mode, TDM sharing) as stored
        self._default_sharing = default_sharing
        self._sharing: dict[int, SharingPolicy] = {}  # TDM cards' sharing policy
        self._records: dict[str, PartitionRecord] = {}
        self._becoming_ready: dict[str, PartitionRecord] = {}  # rows whose CDI device is being written (_save_ready)
        self._card_locks: dict[int, asyncio.Lock] = {}
        self._request_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # request id -> (lock, callers holding it)
        self._creating: set[str] = set()  # partition ids whose create is running now
        self._tasks: set[asyncio.Task[Any]] = set()
        self.reclaimed_total = 0
        self.ready = False  # start() has learned the cards and recovered the stored partitions
        self.reconcile_failures: Counter[str] = Counter()  # "gpu N" or "mps" -> passes that failed there
        self._view = View(partitions=(), cards=())

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
        """One card, or every card that has answered (a card that has not is left out until it joins)."""
        if gpu_ref:
            return [self._capacity(self.resolve_gpu(gpu_ref), room=True)]
        return [self._capacity(i, room=True) for i in sorted(self._infos)]

    def view(self) -> View:
        """The last published picture; safe to read from any thread (metrics scrapes run in the HTTP thread)."""
        return self._view

    def _publish(self) -> None:
        self._view = View(
            partitions=tuple(sorted(self._records.values(), key=lambda r: r.id)),
            cards=tuple(self._capacity(i) for i in sorted(self._infos)),
        )

    def card_known(self, gpu: int) -> bool:
        """Has the card answered since the daemon started (its partitions' edits can be made)?"""
        return gpu in self._infos

    def edits(self, record: PartitionRecord) -> ContainerEdits:
        minor = self._infos[record.gpu].minor_number
        pipe = self._card_sharing(record.gpu).daemon(record).pipe_dir if record.mode is CardMode.TDM else None
        return container_edits(
            record,
            gpu_minor=record.gpu if isinstance(minor, Unsupported) else minor,
            pipe_dir=pipe,
            devices=self._devices,
            hook_path=self._partition_hook,
        )

    def cdi_name(self, record: PartitionRecord) -> str:
        return device_name(record.id)

    def _capacity(self, gpu: int, *, room: bool = False) -> CardCapacity:
        """``room``: with ``mig_room``, which only capacity replies read (the published view goes without it)."""
        return card_capacity(
            self._infos[gpu],
            [r for r in self._records.values() if r.gpu == gpu],
            self._modes[gpu],
            self._profiles.get(gpu, ()),
            self._foreign.get(gpu, ()),
            self._hw_mig.get(gpu, False),
            str(self._sharing.get(gpu, "")),
            room=room,
            driver_version=self._driver_version(),
        )

    def _driver_version(self) -> str:
        snap = self._snapshot()
        return snap.system.driver_version if snap is not None and snap.system is not None else ""

    # ----- helpers -----------------------------------------------------------------------------------------

    def resolve_gpu(self, ref: str) -> int:
        try:
            parsed = parse_gpu_ref(ref)  # ASCII digits only: "٣" is not GPU 3
        except InvalidField as exc:
            raise invalid(str(exc)) from None
        if parsed.index is not None:
            if parsed.index >= self._count:
                raise not_found(f"gpu: no GPU {parsed.index} (this node has {self._count})")
            if parsed.index not in self._infos:
                raise self._not_joined(parsed.index)
            return parsed.index
        for info in self._infos.values():
            if info.uuid.lower() == parsed.uuid.lower():
                return info.index
        waiting = (
            f" (GPU {', '.join(map(str, sorted(self._unanswered)))} has not answered yet)" if self._unanswered else ""
        )
        raise not_found(f"gpu: no GPU with UUID {quote(parsed.uuid)}{waiting}")

    def _not_joined(self, gpu: int) -> PartitionError:
        why = self._unanswered.get(gpu, "not read yet")
        return unavailable(
            f"GPU {gpu} has not answered since the daemon started ({why}); it is partitionable once it does, the "
            "other cards are already"
        )

    def _card_sharing(self, gpu: int) -> CardSharing:
        return CardSharing(self._sharing.get(gpu, self._default_sharing), self.mps)

    async def _store(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._store_io, functools.partial(fn, *args, **kwargs))

    async def _host(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._host_io, functools.partial(fn, *args, **kwargs))

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

    async def _save_ready(self, record: PartitionRecord) -> None:
        """Save a row that has become ready, after its CDI device is in the spec: no one (a retry, a Get, a List)
        sees a partition ready whose CDI name does not resolve yet."""
        # creates on other cards run meanwhile: their spec writes must keep this device too
        self._becoming_ready[record.id] = record
        try:
            await self._write_cdi()
            await self._save(record)
        finally:
            self._becoming_ready.pop(record.id, None)

    async def _forget(self, partition_id: str) -> None:
        await self._store(self.store.delete, partition_id)
        self._records.pop(partition_id, None)
        self._publish()

    async def _follow_clock_steps(self) -> None:
        """Move every lease's stored expiry by a wall-clock step since the last look, so that leases keep running
        for the time they were given (clock_steps.py)."""
        step = self._clock_steps.step()
        if not step:
            return
        leases = [r for r in self._records.values() if r.owner.kind is OwnerKind.LEASE and r.lease_expires_at]
        log.warning("wall clock stepped; lease expiries follow it", step_seconds=round(step, 1), leases=len(leases))
        for record in leases:
            async with self._card_locks[record.gpu]:
                current = self._records.get(record.id)
                if current is not None and current.owner.kind is OwnerKind.LEASE and current.lease_expires_at:
                    await self._save(replace(current, lease_expires_at=current.lease_expires_at + step))

    async def _write_cdi(self, *about_to_be_ready: PartitionRecord) -> None:
        """``about_to_be_ready``: rows that ``_save_ready`` saves only after this write."""
        records = {**self._records, **self._becoming_ready, **{r.id: r for r in about_to_be_ready}}
        ready = [r for r in records.values() if r.state is State.READY and r.gpu in self._infos]

        def write() -> None:
            try:
                self.cdi.write((r.id, self.edits(r)) for r in ready)
            except OSError as exc:
                log.error("cannot write CDI spec", path=str(self.cdi.path), error=str(exc))

        await self._store(write)

    @property
    def cards(self) -> tuple[DeviceInfo, ...]:
        """The cards that have answered, by index (empty before start)."""
        return tuple(self._infos[i] for i in sorted(self._infos))

    @property
    def modes(self) -> dict[int, CardMode]:
        """Each card's partition mode, for the cards that have answered (the CDI spec lists a whole-card device only
        for mode none)."""
        return {gpu: mode for gpu, mode in self._modes.items() if gpu in self._infos}
