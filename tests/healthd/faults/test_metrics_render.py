"""The fault collector's kept blocks never serve stale lines: rendered the way the daemon serves it (SnapshotRenderer,
blocks kept under versions), each render is byte for byte prometheus_client's encoding of the same state (the
collector's families written afresh), through check status changes, faults opening and resolving, XID counts and
the hook outbox. And an unchanged state reuses its kept lines."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors.render import SnapshotRenderer
from exporter.encoding import Section
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.faults.metrics import STATUS, FaultMetricsCollector
from healthd.faults.outbox import HookDispatcher
from healthd.findings import Action, CheckResult, CheckStatus, Finding, GpuRef, ProbeReport, Severity
from tests.exporter.collectors.test_render import fast, reference
from tests.support.clock import FakeClock
from tests.support.faults_helpers import make_engine, xid

GPUS = tuple(GpuRef(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", f"00000000:{i + 16:02X}:00.0") for i in range(3))
CHECKS = ("ecc", "nvlink")
TARGETS = ("unix:/run/hook.sock", "10.0.0.5:7000")
NOW = 1_800_000_000.0


@dataclass
class _Hooks:
    """What the collector reads of a HookDispatcher."""

    depth: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))


class _Node:
    """An engine fed check reports (a failed card opens a fault, an ok one resolves it) and XID events."""

    def __init__(self, state: Path) -> None:
        self.clock = FakeClock()
        self.engine = make_engine(
            state, self.clock, targets=TARGETS, open_after_evaluations=1, resolve_after_evaluations=1
        )
        self.hooks = _Hooks()
        self.collector = FaultMetricsCollector(self.engine, cast("HookDispatcher", self.hooks), node_name="node-7")
        self.status = {(c, g.index): CheckStatus.OK for c in CHECKS for g in GPUS}
        self.node_wide = CheckStatus.OK

    def report(self, check: str) -> None:
        results = [CheckResult(check, g, self.status[(check, g.index)]) for g in GPUS]
        findings = [
            Finding(check, f"{check}_bad", Severity.CRITICAL, Action.RESET_GPU, "bad", g)
            for g in GPUS
            if self.status[(check, g.index)] is CheckStatus.FAILED
        ]
        if check == "ecc":  # and one node-wide result
            results.append(CheckResult(check, None, self.node_wide))
        self.clock.advance(5.0)
        self.engine.accept_report(ProbeReport(check, tuple(results), tuple(findings)))

    def close(self) -> None:
        self.engine.journal.close()


@pytest.fixture(scope="module")
def snapshot() -> Iterator[Snapshot]:
    sampler = Sampler(
        SimulatedBackend.from_name("h200x1"), SamplerSettings(interval_seconds=5, call_deadline_seconds=5)
    )
    try:
        yield sampler.run_once()
    finally:
        sampler.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[_Node]:
    n = _Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


def _renderer(node: _Node) -> SnapshotRenderer:
    return SnapshotRenderer([node.collector], clock=lambda: NOW, monotonic=lambda: 0.0)


def _same_as_prometheus_client(renderer: SnapshotRenderer, node: _Node, snapshot: Snapshot) -> None:
    assert fast(renderer, snapshot) == reference(snapshot, [node.collector], NOW)


def _status_runs(renderer: SnapshotRenderer, snapshot: Snapshot) -> tuple[object, ...]:
    (section,) = [
        s for s in renderer.render(snapshot).sections if isinstance(s, Section) and STATUS.sample in s.samples
    ]
    return section.runs


def test_each_change_shows_in_the_next_render(node: _Node, snapshot: Snapshot) -> None:
    renderer = _renderer(node)
    _same_as_prometheus_client(renderer, node, snapshot)  # nothing reported yet: the families' headers only
    for check in CHECKS:
        node.report(check)
    _same_as_prometheus_client(renderer, node, snapshot)
    _same_as_prometheus_client(renderer, node, snapshot)  # from kept blocks

    node.status[("ecc", 1)] = CheckStatus.FAILED  # a check's status changes, and a fault opens
    node.report("ecc")
    text = fast(renderer, snapshot)[0].decode()
    assert f'xpu_health_check_status{{check="ecc",gpu="1",status="failed",uuid="{GPUS[1].uuid}"}} 1.0' in text
    assert 'code="ecc_bad"' in text
    _same_as_prometheus_client(renderer, node, snapshot)

    node.status[("ecc", 1)] = CheckStatus.OK  # it resolves
    node.report("ecc")
    assert 'code="ecc_bad"' not in fast(renderer, snapshot)[0].decode()
    _same_as_prometheus_client(renderer, node, snapshot)

    node.node_wide = CheckStatus.UNKNOWN  # the node-wide result
    node.report("ecc")
    _same_as_prometheus_client(renderer, node, snapshot)

    node.engine.accept_event(xid(79, GPUS[2]))  # an XID count
    _same_as_prometheus_client(renderer, node, snapshot)
    node.engine.accept_event(xid(79, GPUS[2]))
    assert f'xpu_xid_errors_total{{gpu="2",uuid="{GPUS[2].uuid}",xid="79"}} 2.0' in fast(renderer, snapshot)[0].decode()
    _same_as_prometheus_client(renderer, node, snapshot)

    node.hooks.depth[TARGETS[0]] = 3  # the outbox
    assert f'xpu_hook_outbox_depth{{target="{TARGETS[0]}"}} 3.0' in fast(renderer, snapshot)[0].decode()
    _same_as_prometheus_client(renderer, node, snapshot)
    node.hooks.failures[TARGETS[1]] = 1
    _same_as_prometheus_client(renderer, node, snapshot)

    fault = node.engine.active_faults()[0]  # an operator resolves the XID's fault
    assert node.engine.resolve_by_operator(fault.id, "replaced") is not None
    assert fault.id not in fast(renderer, snapshot)[0].decode()
    _same_as_prometheus_client(renderer, node, snapshot)


def test_repeated_statuses_keep_their_lines(node: _Node, snapshot: Snapshot) -> None:
    """Every report makes new CheckStates; only a changed status rewrites lines, and only its own check's."""
    for check in CHECKS:
        node.report(check)
    renderer = _renderer(node)
    first = _status_runs(renderer, snapshot)
    assert len(first) == len(CHECKS)  # one block per check
    version = node.engine.check_statuses()[0]
    for check in CHECKS:
        node.report(check)  # the same statuses again
    assert node.engine.check_statuses()[0] == version
    again = _status_runs(renderer, snapshot)
    assert all(a is b for a, b in zip(first, again, strict=True))

    node.status[("nvlink", 0)] = CheckStatus.WARNING
    node.report("nvlink")
    assert node.engine.check_statuses()[0] != version
    changed = _status_runs(renderer, snapshot)
    assert changed[0] is again[0]  # ecc: kept
    assert changed[1] is not again[1] and changed[1] != again[1]  # nvlink: rewritten
    _same_as_prometheus_client(renderer, node, snapshot)


def test_a_card_that_moves_to_another_index_moves_its_lines(node: _Node, snapshot: Snapshot) -> None:
    """The status version covers the card's index too, not only its status."""
    node.report("ecc")
    renderer = _renderer(node)
    _same_as_prometheus_client(renderer, node, snapshot)
    moved = GpuRef(7, GPUS[0].uuid, GPUS[0].pci_bus_id)
    node.engine.accept_report(ProbeReport("ecc", (CheckResult("ecc", moved, CheckStatus.OK),), ()))
    assert 'gpu="7"' in fast(renderer, snapshot)[0].decode()
    _same_as_prometheus_client(renderer, node, snapshot)


_steps = st.one_of(
    st.tuples(st.just("status"), st.sampled_from(CHECKS), st.integers(0, len(GPUS) - 1), st.sampled_from(CheckStatus)),
    st.tuples(st.just("node_wide"), st.sampled_from(CheckStatus)),
    st.tuples(st.just("repeat"), st.sampled_from(CHECKS)),
    st.tuples(st.just("xid"), st.integers(0, len(GPUS) - 1), st.sampled_from((13, 31, 79))),
    st.tuples(st.just("quiet"), st.just(0)),
    st.tuples(st.just("operator"), st.just(0)),
    st.tuples(st.just("depth"), st.sampled_from(TARGETS), st.integers(0, 5)),
    st.tuples(st.just("failures"), st.sampled_from(TARGETS), st.integers(0, 5)),
)


def _apply(node: _Node, step: tuple[object, ...]) -> None:
    kind = step[0]
    if kind == "status":
        check, index, status = cast("tuple[str, int, CheckStatus]", step[1:])
        node.status[(check, index)] = status
        node.report(check)
    elif kind == "node_wide":
        node.node_wide = cast("CheckStatus", step[1])
        node.report("ecc")
    elif kind == "repeat":
        node.report(cast("str", step[1]))
    elif kind == "xid":
        index, code = cast("tuple[int, int]", step[1:])
        node.engine.accept_event(xid(code, GPUS[index]))
    elif kind == "quiet":  # quiet event faults resolve
        node.clock.advance(601.0)
        node.engine.tick()
    elif kind == "operator":
        active = node.engine.active_faults()
        if active:
            node.engine.resolve_by_operator(active[-1].id, "fixed")
    elif kind == "depth":
        node.hooks.depth[cast("str", step[1])] = cast("int", step[2])
    else:
        node.hooks.failures[cast("str", step[1])] = cast("int", step[2])


@settings(max_examples=50)
@given(st.lists(_steps, min_size=1, max_size=12))
def test_any_sequence_of_changes_renders_as_prometheus_client_does(
    snapshot: Snapshot, steps: list[tuple[object, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as state:
        node = _Node(Path(state))
        try:
            for check in CHECKS:
                node.report(check)
            renderer = _renderer(node)
            _same_as_prometheus_client(renderer, node, snapshot)
            for step in steps:
                _apply(node, step)
                _same_as_prometheus_client(renderer, node, snapshot)
        finally:
            node.close()
