"""Stateful property test: any sequence of mode changes, creates, deletes, lease renewals, MIG users, daemon
restarts and reconcile passes keeps every invariant: no over-commit, store = memory = CDI = GPU, foreign untouched."""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from exporter.backends.simulated import SimulatedBackend
from healthd.partition.cdi import SPEC_FILE
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind, State
from healthd.partition.mps import SimulatedMpsControl
from healthd.partition.settings import PartitionSettings
from healthd.partition.sharing import SharingPolicy, shared_daemon_id
from tests.support.clock import FakeClock
from tests.support.partition_node import Node

CARDS = ("1", "2", "6", "7")  # 1, 2: MIG off in hardware; 6: MIG on, empty; 7: MIG on with 2 foreign instances
EXPECTED_FAILURES = {Kind.INVALID, Kind.EXHAUSTED, Kind.PRECONDITION, Kind.NOT_FOUND, Kind.CONFLICT}


class PartitionMachine(RuleBasedStateMachine):
    SHARING = SharingPolicy.ISOLATED

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        backend = SimulatedBackend.from_name("h200x8")
        backend.open()
        self.node = Node(root=Path(self.tmp.name), backend=backend, clock=FakeClock(), sharing=self.SHARING)
        self.loop = asyncio.new_event_loop()
        self.mps = SimulatedMpsControl()
        self.foreign = {i.uuid for i in backend.mig_instances(7)}
        self.ids = itertools.count(1)  # deterministic ids keep "pick" reproducible when hypothesis replays
        self.manager = self._start()
        self.busy_pid = 90000

    def _start(self) -> PartitionManager:
        limits = PartitionSettings(owner_grace_seconds=0)
        m = self.node.manager(mps=self.mps, settings=limits, new_id=lambda: f"p-{next(self.ids):06d}")
        self.loop.run_until_complete(m.start())
        return m

    def run(self, coro: object) -> object:
        try:
            return self.loop.run_until_complete(coro)  # type: ignore[arg-type]
        except PartitionError as exc:
            if exc.kind not in EXPECTED_FAILURES:
                raise AssertionError(f"unexpected {exc.kind}: {exc.message}") from exc
            return None

    def teardown(self) -> None:
        self.loop.run_until_complete(self.manager.close())
        self.loop.close()
        self.tmp.cleanup()

    @rule(card=st.sampled_from(CARDS), mode=st.sampled_from(list(CardMode)))
    def set_mode(self, card: str, mode: CardMode) -> None:
        self.run(self.manager.set_mode(card, mode))

    @rule(
        card=st.sampled_from([*CARDS, "any"]),
        compute=st.integers(0, 100),
        memory_units=st.integers(0, 600),
        ttl=st.sampled_from([0.0, 30.0, 300.0]),
        request_id=st.sampled_from(["", "", "r1", "r2"]),
    )
    def create(self, card: str, compute: int, memory_units: int, ttl: float, request_id: str) -> None:
        self.run(
            self.manager.create(
                CreateRequest(Owner(OwnerKind.LEASE, holder="h"), card, compute, memory_units * 128, request_id, ttl)
            )
        )

    @precondition(lambda self: bool(self.manager.list_partitions()))
    @rule(pick=st.integers(0, 1000))
    def delete(self, pick: int) -> None:
        parts = self.manager.list_partitions()
        self.run(self.manager.delete(parts[pick % len(parts)].id))

    @precondition(lambda self: bool([p for p in self.manager.list_partitions() if p.mig]))
    @rule(pick=st.integers(0, 1000))
    def use_mig_instance(self, pick: int) -> None:
        parts = [p for p in self.manager.list_partitions() if p.mig and p.mig.uuid]
        p = parts[pick % len(parts)]
        assert p.mig is not None
        self.busy_pid += 1
        self.node.backend.inject(
            "process_start", p.gpu, {"pid": str(self.busy_pid), "gpu_instance_id": str(p.mig.gpu_instance_id)}
        )

    @rule()
    def processes_exit(self) -> None:
        for gpu in (6, 7):
            for proc in self.node.backend.processes(gpu):
                if proc.pid > 90000:
                    self.node.backend.inject("process_exit", gpu, {"pid": str(proc.pid)})

    @precondition(lambda self: bool(self.manager.list_partitions()))
    @rule(pick=st.integers(0, 1000), ttl=st.sampled_from([0.0, 60.0]))
    def renew(self, pick: int, ttl: float) -> None:
        parts = self.manager.list_partitions()
        self.run(self.manager.renew_lease(parts[pick % len(parts)].id, ttl))

    @rule(seconds=st.sampled_from([0.0, 20.0, 100.0, 400.0]))
    def time_passes_and_reconcile(self, seconds: float) -> None:
        self.node.clock.advance(seconds)
        self.run(self.manager.reconcile())

    @rule()
    def mps_daemon_dies(self) -> None:
        for pid in sorted(self.mps.running())[:1]:
            self.mps.kill(pid)

    @rule()
    def daemon_restarts(self) -> None:
        self.loop.run_until_complete(self.manager.close())
        self.mps = SimulatedMpsControl()  # the in-process stand-in dies with the daemon; real MPS daemons would not
        self.manager = self._start()

    @invariant()
    def no_overcommit_and_everything_agrees(self) -> None:
        m = self.manager
        records = m.list_partitions()
        for cap in m.capacity():
            assert cap.compute_percent_allocated <= 100
            assert cap.memory_allocated_mib <= cap.memory_total_mib
        # memory and store agree
        assert {r.id: r for r in m.store.all()} == {r.id: r for r in records}
        # every partition sits on a card in its own mode
        modes = {c.gpu: c.mode for c in m.capacity()}
        assert all(modes[r.gpu] is r.mode for r in records)
        # MIG: our instances on the GPU are exactly our MIG partitions; foreign ones are still there
        for gpu in (6, 7):
            on_gpu = {i.uuid for i in self.node.backend.mig_instances(gpu)}
            ours = {r.mig.uuid for r in records if r.gpu == gpu and r.mig}
            assert ours <= on_gpu
            assert on_gpu - ours == (self.foreign if gpu == 7 else set())
        # TDM: the daemons the policy asks for, one per partition or one per card with TDM partitions (after a
        # kill, until the next reconcile, one may be missing), and never one that nothing needs
        tdm = [r for r in records if r.mode is CardMode.TDM and r.state is State.READY]
        wanted = (
            {r.id for r in tdm}
            if self.SHARING is SharingPolicy.ISOLATED
            else {shared_daemon_id(r.gpu_uuid) for r in tdm}
        )
        assert self.mps.running() <= wanted
        # CDI lists exactly the ready partitions
        spec_path = self.node.cdi_dir / SPEC_FILE
        ready = {r.id for r in records if r.state is State.READY}
        names = {d["name"] for d in json.loads(spec_path.read_text())["devices"]} if spec_path.exists() else set()
        assert names == ready


class SharedPartitionMachine(PartitionMachine):
    SHARING = SharingPolicy.SHARED


TestPartitionMachine = PartitionMachine.TestCase
TestPartitionMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestSharedPartitionMachine = SharedPartitionMachine.TestCase
TestSharedPartitionMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
