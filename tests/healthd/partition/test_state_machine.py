"""The partition state machine closes every path: cancelled creates, stale 'creating' rows, late MIG creates,
hung cards that must not stop reconcile for the others, mode changes on cards that cannot be read."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import SamplerSettings
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.partition.cdi import CdiWriter
from healthd.partition.component import SERVICE_NAME, add_partitions
from healthd.partition.edits import ContainerEdits
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.mps_spec import MpsDaemonSpec
from healthd.partition.owners import OwnerProbe
from healthd.partition.service import PartitionsService
from healthd.partition.settings import PartitionSettings
from healthd.partition.store import Store
from healthd.rpc.server import GrpcServer, Service
from tests.support.clock import FakeClock

FAST = SamplerSettings(call_deadline_seconds=0.3, change_deadline_seconds=0.5, open_deadline_seconds=1.0)
LEASE = Owner(OwnerKind.LEASE, holder="test")


class SlowMps(SimulatedMpsControl):
    """Starting a control daemon takes a while, as the real binary does: cancellations land in the middle."""

    def start(self, spec: MpsDaemonSpec) -> None:
        time.sleep(0.02)
        super().start(spec)


class SlowCdi(CdiWriter):
    """Writing the spec takes a while (a busy disk, a loaded machine): what is seen meanwhile must already hold."""

    def write(self, devices: Iterable[tuple[str, ContainerEdits]]) -> None:
        time.sleep(0.3)
        super().write(devices)


def make_manager(
    root: Path,
    backend: SimulatedBackend,
    clock: FakeClock,
    *,
    mps: SimulatedMpsControl | None = None,
    cdi: type[CdiWriter] = CdiWriter,
) -> PartitionManager:
    return PartitionManager(
        GuardedBackend(DeviceAccess(backend, FAST)),
        Store(root / "state" / "partitions.sqlite"),
        MpsSupervisor(mps or SimulatedMpsControl(), root / "run"),
        cdi(root / "cdi"),
        OwnerProbe(cgroup_root=root / "cgroup", clock=clock),
        settings=PartitionSettings(owner_grace_seconds=0.0),
        destroy_retry_seconds=0.0,
        creating_timeout_seconds=30.0,
        clock=clock,
    )


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    b = SimulatedBackend.from_name("h200x8")
    b.open()
    yield b
    b.clear()


def rows(manager: PartitionManager) -> list[PartitionRecord]:
    return manager.store.all()


def test_creates_cancelled_by_their_client_leave_no_row_creating(tmp_path: Path, backend: SimulatedBackend) -> None:
    """80 creates over a real channel with 5-10 ms deadlines: every one is finished or rolled back."""
    clock = FakeClock()
    manager = make_manager(tmp_path, backend, clock, mps=SlowMps())
    server = GrpcServer(
        [f"unix:{tmp_path}/admin.sock"],
        [Service(SERVICE_NAME, PartitionsService(manager, writable=True), add_partitions)],
        socket_mode=0o600,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro: object, timeout: float = 60) -> object:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)  # type: ignore[arg-type]

    on_loop(manager.start())
    on_loop(server.start())
    on_loop(manager.set_mode("2", CardMode.TDM))
    on_loop(manager.set_mode("3", CardMode.TDM))
    rng = random.Random(7)
    codes: dict[str, int] = {}
    with grpc.insecure_channel(f"unix:{tmp_path}/admin.sock") as channel:
        stub = pb_grpc.PartitionsStub(channel)
        for i in range(80):
            request = pb.CreatePartitionRequest(
                owner=pb.Owner(lease=pb.LeaseOwner(holder=f"c{i}", ttl_seconds=600)),
                gpu=str(2 + i % 2),
                compute_percent=1,
                memory="128MiB",
            )
            try:
                stub.CreatePartition(request, timeout=rng.uniform(0.005, 0.010))
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            codes[code] = codes.get(code, 0) + 1
    assert codes.get("DEADLINE_EXCEEDED", 0) > 0, f"the deadlines must actually cut calls short: {codes}"
    assert on_loop(manager.settle(grace_seconds=30)), "creates that lost their caller still run to their end"
    clock.advance(60)
    for _ in range(2):
        on_loop(manager.reconcile())
    assert [r.id for r in rows(manager) if r.state is State.CREATING] == []
    assert [r.id for r in manager.list_partitions() if r.state is State.CREATING] == []
    assert {r.id for r in rows(manager)} == {r.id for r in manager.list_partitions()}, "store = memory"
    on_loop(manager.close())
    on_loop(server.stop(0))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_a_stale_creating_row_is_finished_or_dropped(tmp_path: Path, backend: SimulatedBackend) -> None:
    """Rows left 'creating' (a crash mid-create): TDM is finished, a MIG row without an instance is dropped."""

    async def go() -> None:
        clock = FakeClock()
        m = make_manager(tmp_path, backend, clock)
        await m.start()
        await m.set_mode("2", CardMode.TDM)
        await m.set_mode("6", CardMode.MIG)
        info2, info6 = backend.device_info(2), backend.device_info(6)
        base = PartitionRecord(
            id="p-tdm", gpu=2, gpu_uuid=info2.uuid, mode=CardMode.TDM, compute_percent=10, memory_mib=1024,
            owner=LEASE, state=State.CREATING, created_at=clock.now, lease_expires_at=clock.now + 600,
        )  # fmt: skip
        m.store.insert(base)
        m.store.insert(
            replace(
                base, id="p-mig", gpu=6, gpu_uuid=info6.uuid, mode=CardMode.MIG,
                mig=MigPlacement(19, "1g.18gb", 3, 1),
            )
        )  # fmt: skip
        await m.close()
        m = make_manager(tmp_path, backend, clock)
        await m.start()  # recovery at start handles them at once
        assert {r.id: r.state for r in rows(m)} == {"p-tdm": State.READY}
        await m.close()

    asyncio.run(go())


def test_a_hung_card_does_not_stop_reclaim_on_the_other_cards(tmp_path: Path, backend: SimulatedBackend) -> None:
    async def go() -> None:
        clock = FakeClock()
        m = make_manager(tmp_path, backend, clock)
        await m.start()
        await m.set_mode("2", CardMode.TDM)
        await m.set_mode("6", CardMode.MIG)
        short = await m.create(CreateRequest(LEASE, "2", 10, 1024, lease_ttl_seconds=1))
        mig = await m.create(CreateRequest(LEASE, "6", 10, 10240, lease_ttl_seconds=1))
        backend.inject("hang", 6, {"call": "*"})
        clock.advance(5)  # both leases expired
        for _ in range(3):
            reclaimed = await m.reconcile()
            if short.id in reclaimed:
                break
        assert short.id not in {r.id for r in rows(m)}, "GPU 2's expired lease is reclaimed although GPU 6 hangs"
        stuck = {r.id: r.state for r in rows(m)}
        assert stuck == {mig.id: State.DELETING}, "GPU 6's partition waits, marked deleting"
        assert m.reconcile_failures["gpu 6"] >= 1
        backend.clear(6)
        assert await _eventually(lambda: not m.device.access.hung())
        await m.reconcile()
        assert rows(m) == [], "once the card answers, the pending delete finishes"
        await m.close()

    asyncio.run(go())


def test_a_late_mig_create_is_adopted_when_the_card_answers(tmp_path: Path, backend: SimulatedBackend) -> None:
    async def go() -> None:
        clock = FakeClock()
        m = make_manager(tmp_path, backend, clock)
        await m.start()
        await m.set_mode("6", CardMode.MIG)
        backend.inject("hang", 6, {"call": "create_mig_instance"})
        with pytest.raises(PartitionError) as late:
            await m.create(CreateRequest(LEASE, "6", 10, 10240, lease_ttl_seconds=600))
        assert late.value.kind is Kind.UNAVAILABLE
        assert "GPU 6" in late.value.message and "stays 'creating'" in late.value.message
        (row,) = rows(m)
        assert row.state is State.CREATING and row.mig is not None and not row.mig.uuid
        with pytest.raises(PartitionError) as busy:  # its placement stays taken while the outcome is unknown
            await m.create(CreateRequest(LEASE, "6", 10, 10240, lease_ttl_seconds=600))
        assert busy.value.kind is Kind.UNAVAILABLE  # the card is hung in the create: fail fast
        backend.clear(6)  # the driver finishes the create
        assert await _eventually(lambda: not m.device.access.hung())
        clock.advance(60)
        await m.reconcile()
        (adopted,) = rows(m)
        assert adopted.id == row.id and adopted.state is State.READY
        assert adopted.mig is not None and adopted.mig.uuid.startswith("MIG-")
        assert m.capacity("6")[0].foreign == (), "ours, not a foreign instance"
        await m.close()

    asyncio.run(go())


def test_a_mode_change_on_a_card_that_cannot_be_read_is_refused(tmp_path: Path, backend: SimulatedBackend) -> None:
    async def go() -> None:
        m = make_manager(tmp_path, backend, FakeClock())
        await m.start()
        backend.inject("hang", 3, {"call": "*"})
        for _ in range(2):  # first the deadline passes, then the card fails fast
            with pytest.raises(PartitionError) as refused:
                await m.set_mode("3", CardMode.TDM)
            assert refused.value.kind is Kind.UNAVAILABLE
            assert "GPU 3" in refused.value.message and "the mode stays none" in refused.value.message
        assert m.capacity("3")[0].mode is CardMode.NONE
        await m.close()

    asyncio.run(go())


async def _eventually(condition: Callable[[], bool], within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


def test_a_late_mig_create_is_in_the_cdi_spec_once_adopted_and_retries_wait_for_it(
    tmp_path: Path, backend: SimulatedBackend
) -> None:
    """No reconcile pass and no clock step: the driver's late answer alone adopts the instance and writes the spec.
    Until then a retry with the same request_id answers UNAVAILABLE (no env and no CDI device exist yet); a slow
    spec write shows that the partition is not seen ready before its CDI device is in the spec."""

    async def go() -> None:
        clock = FakeClock()
        m = make_manager(tmp_path, backend, clock, cdi=SlowCdi)
        await m.start()
        await m.set_mode("6", CardMode.MIG)
        backend.inject("hang", 6, {"call": "create_mig_instance"})
        request = CreateRequest(LEASE, "6", 10, 10240, request_id="job-6", lease_ttl_seconds=600)
        with pytest.raises(PartitionError) as late:
            await m.create(request)
        assert late.value.kind is Kind.UNAVAILABLE
        (row,) = rows(m)
        with pytest.raises(PartitionError) as retry:
            await m.create(request)
        assert retry.value.kind is Kind.UNAVAILABLE
        assert row.id in retry.value.message and "still being created" in retry.value.message
        backend.clear(6)
        assert await _eventually(lambda: m.get(row.id).state is State.READY)
        spec = json.loads((tmp_path / "cdi" / "xpu-runtime-kit.io-gpu.json").read_text())
        assert row.id in {d["name"] for d in spec["devices"]}
        again = await m.create(request)
        assert again.id == row.id and again.state is State.READY and m.edits(again).env["CUDA_VISIBLE_DEVICES"]
        await m.close()

    asyncio.run(go())


@pytest.mark.parametrize("mode", [CardMode.TDM, CardMode.MIG])
def test_a_partition_created_the_normal_way_is_never_listed_ready_before_its_cdi_device_is_in_the_spec(
    tmp_path: Path, backend: SimulatedBackend, mode: CardMode
) -> None:
    """While a create waits on a slow spec write, a Get or List made meanwhile (another client) never sees a ready
    partition whose CDI name a runtime could not resolve yet."""

    async def go() -> None:
        clock = FakeClock()
        m = make_manager(tmp_path, backend, clock, cdi=SlowCdi)
        await m.start()
        gpu = "6" if mode is CardMode.MIG else "5"  # card 6 of h200x8 has MIG mode on
        await m.set_mode(gpu, mode)
        spec_path = tmp_path / "cdi" / "xpu-runtime-kit.io-gpu.json"
        unresolved: list[str] = []
        creating = asyncio.ensure_future(m.create(CreateRequest(LEASE, gpu, 10, 10240, lease_ttl_seconds=600)))
        while not creating.done():
            ready = [r.id for r in m.list_partitions() if r.state is State.READY]
            if ready:
                spec = json.loads(spec_path.read_text()) if spec_path.exists() else {"devices": []}
                names = {d["name"] for d in spec["devices"]}
                unresolved += [pid for pid in ready if pid not in names]
            await asyncio.sleep(0.01)
        record = creating.result()
        assert record.state is State.READY
        assert not unresolved, f"listed ready before its CDI device was written: {unresolved}"
        spec = json.loads(spec_path.read_text())
        assert record.id in {d["name"] for d in spec["devices"]}
        await m.close()

    asyncio.run(go())
