"""The memory-leak probe gives the reports of its previous implementation (memory_leak_reference.py) over any run of
snapshots hypothesis finds: two cards whose processes start, grow, shrink, stop reporting memory, leave /proc, come
back (pid reuse) and leave the listing, cards whose process list is unknown or whose sample is stale, unowned memory
and an MPS server, with /proc read through one listing per evaluation or one stat per pid."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution.resolver import MPS_SERVER
from exporter.backends.types import UNSUPPORTED, GpuProcess
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import ProbeReport
from healthd.probes.memory_leak import MIB, MemoryLeakProbe, Settings
from tests.healthd.probes.memory_leak_reference import ReferenceMemoryLeakProbe
from tests.support.clock import FakeClock
from tests.support.probe_node import Node

PIDS = (101, 102, 103, 104)
THRESHOLDS = Settings(
    orphan_min_mib=1024,
    orphan_samples=2,
    gone_samples=3,
    growth_window_seconds=60.0,
    growth_min_mib=512,
    growth_min_samples=3,
)


@pytest.fixture(scope="module")
def template() -> Iterator[Snapshot]:
    node = Node("h200x8", FakeClock())
    yield node.tick()
    node.close()


# one process on one card in one cycle: listed or not, and its memory's move (256 MiB steps) or unreported
PROCESS = st.tuples(st.sampled_from([True, True, True, False]), st.sampled_from([0, 0, 0, 1, 1, 2, -1, None]))
CARD = st.tuples(
    st.sampled_from(["known", "known", "known", "known", "unknown", "stale"]),
    st.sampled_from([0, 0, 0, 4096]),  # unowned memory (MiB)
    st.booleans(),  # pid 104 is an MPS server on this card
    st.lists(PROCESS, min_size=len(PIDS), max_size=len(PIDS)),
)
# seconds since the last cycle, each pid present in /proc or not, the two cards
CYCLE = st.tuples(
    st.sampled_from([0.0, 5.0, 5.0, 5.0, 30.0]),
    st.lists(st.sampled_from([True, True, False]), min_size=len(PIDS), max_size=len(PIDS)),
    st.lists(CARD, min_size=2, max_size=2),
)


def _card(g: GpuSnapshot, state: str, processes: tuple[GpuProcess, ...], unowned_mib: int) -> GpuSnapshot:
    assert g.sample is not None
    owned = sum(p.used_memory_bytes for p in processes if isinstance(p.used_memory_bytes, int))
    sample = dataclasses.replace(g.sample, memory_used_bytes=owned + unowned_mib * MIB)
    if state == "stale":
        return dataclasses.replace(g, fresh=False, error="timeout", processes=processes, sample=sample)
    if state == "unknown":
        return dataclasses.replace(g, processes=(), sample=sample, partial_errors={"processes": "no_permission: x"})
    return dataclasses.replace(g, processes=processes, sample=sample, partial_errors={})


def _comparable(report: ProbeReport) -> tuple[object, ...]:
    return report.results, tuple(
        (f.code, f.gpu, f.severity, f.action, f.message, dict(f.evidence)) for f in report.findings
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(CYCLE, min_size=1, max_size=40), st.booleans())
def test_reports_are_those_of_the_previous_implementation(
    template: Snapshot,
    tmp_path: Path,
    cycles: list[tuple[float, list[bool], list[tuple[str, int, bool, list[tuple[bool, int | None]]]]]],
    listing: bool,
) -> None:
    proc = tmp_path / "proc"
    shutil.rmtree(proc, ignore_errors=True)
    proc.mkdir()
    (proc / "self").mkdir()  # entries that are not listed pids
    probe = MemoryLeakProbe(THRESHOLDS, proc_root=proc)
    probe._proc_entries = 0 if listing else 1_000_000  # list /proc every evaluation, or never
    reference = ReferenceMemoryLeakProbe(THRESHOLDS, proc_root=proc)
    now = 1_800_000_000.0
    memory = {(c, pid): 4 for c in range(2) for pid in PIDS}
    for dt, alive, cards in cycles:
        now += dt
        gpus = list(template.gpus)
        for c, (state, unowned, mps, procs) in enumerate(cards):
            listed = []
            for pid, (on, move) in zip(PIDS, procs, strict=True):
                if move is not None:
                    memory[(c, pid)] = max(0, memory[(c, pid)] + move)
                if not on:
                    continue
                used = UNSUPPORTED if move is None else memory[(c, pid)] * 256 * MIB
                name = MPS_SERVER if mps and pid == 104 else "" if pid == 103 else "train"  # 103: name from /proc
                listed.append(GpuProcess(pid, used, UNSUPPORTED, UNSUPPORTED, name))
            gpus[c] = _card(gpus[c], state, tuple(listed), unowned)
        for pid, present in zip(PIDS, alive, strict=True):
            d = proc / str(pid)
            if present and not d.exists():
                d.mkdir()
                (d / "comm").write_text("python\n")
            elif not present and d.exists():
                shutil.rmtree(d)
        snap = dataclasses.replace(template, gpus=tuple(gpus[:2]))
        assert _comparable(probe.evaluate(snap, now)) == _comparable(reference.evaluate(snap, now))
