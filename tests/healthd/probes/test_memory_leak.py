from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exporter.backends.errors import BackendError
from exporter.backends.types import GpuProcess
from healthd.findings import Action, Severity
from healthd.probes.memory_leak import MemoryLeakProbe, Settings
from tests.support.probe_node import Node, codes, only, status


def _proc_for(node: Node, tmp_path: Path, *, without: tuple[int, ...] = ()) -> Path:
    """A /proc with a directory for every process the simulated node runs, except ``without``."""
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    for g in node.sampler.run_once().gpus:
        for p in g.processes:
            if p.pid not in without:
                (root / str(p.pid)).mkdir(exist_ok=True)
                (root / str(p.pid) / "comm").write_text(p.name + "\n")
    return root


def _probe(proc: Path | None, **thresholds: int | float) -> MemoryLeakProbe:
    return MemoryLeakProbe(Settings(**thresholds), proc_root=proc)  # type: ignore[arg-type]


def test_busy_node_without_leaks(h200x8: Node, tmp_path: Path) -> None:
    probe = _probe(_proc_for(h200x8, tmp_path))
    for _ in range(8):
        report = probe.evaluate(h200x8.tick(), h200x8.clock())
        assert report.findings == ()
    assert {str(r.status) for r in report.results} == {"ok"}


def test_unowned_memory_held_over_several_samples(h200x8: Node, tmp_path: Path) -> None:
    probe = _probe(_proc_for(h200x8, tmp_path), orphan_samples=3)
    h200x8.inject("orphan_memory", 5, memory_mib=4096)
    for i in range(3):
        report = probe.evaluate(h200x8.tick(), h200x8.clock())
        assert (codes(report, 5) == {"memory_unowned"}) == (i == 2)
    f = only(report, "memory_unowned")
    assert (f.severity, f.action) == (Severity.WARNING, Action.RESET_GPU)
    assert f.evidence["unowned_bytes"] == str(4096 * 2**20)
    h200x8.backend.clear(5)
    assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()


def test_small_unowned_memory_is_ignored(h200x8: Node) -> None:
    probe = _probe(None, orphan_samples=1)
    h200x8.inject("orphan_memory", 5, memory_mib=256)
    assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()


def test_unowned_memory_under_mps_is_expected(h200x1: Node, tmp_path: Path) -> None:
    h200x1.inject("process_start", 0, pid=777, name="nvidia-cuda-mps-server", memory_mib=66)
    h200x1.inject("orphan_memory", 0, memory_mib=8192)  # the MPS clients' memory, listed nowhere
    probe = _probe(_proc_for(h200x1, tmp_path), orphan_samples=1)
    for _ in range(3):
        report = probe.evaluate(h200x1.tick(), h200x1.clock())
        assert report.findings == ()
    assert "MPS" in report.results[0].detail


def test_unowned_memory_under_mps_is_expected_by_the_name_proc_keeps(h200x1: Node, tmp_path: Path) -> None:
    # the real NVML lists no names: the server's comes from /proc/<pid>/comm, cut by the kernel to 15 bytes
    h200x1.inject("process_start", 0, pid=777, name="", memory_mib=66)
    h200x1.inject("orphan_memory", 0, memory_mib=8192)
    proc = _proc_for(h200x1, tmp_path)
    (proc / "777" / "comm").write_text("nvidia-cuda-mps\n")
    probe = _probe(proc, orphan_samples=1)
    report = probe.evaluate(h200x1.tick(), h200x1.clock())
    assert report.findings == ()
    assert "MPS" in report.results[0].detail
    (proc / "777" / "comm").write_text("python3\n")  # any other nameless process owns no more than it is listed with
    assert codes(probe.evaluate(h200x1.tick(), h200x1.clock())) == {"memory_unowned"}


def test_names_are_read_from_proc_only_for_a_card_with_unowned_memory(
    h200x1: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h200x1.inject("process_start", 0, pid=777, name="", memory_mib=66)
    proc = _proc_for(h200x1, tmp_path)
    (proc / "777" / "comm").write_text("nvidia-cuda-mps\n")
    probe = _probe(proc, orphan_samples=1)
    read: list[int] = []
    name = probe._name
    monkeypatch.setattr(probe, "_name", lambda p: read.append(p.pid) or name(p))
    probe.evaluate(h200x1.tick(), h200x1.clock())
    assert read == []  # every byte used is owned: no comm read (a real node lists no names: one read a process)
    h200x1.inject("orphan_memory", 0, memory_mib=8192)
    assert "MPS" in probe.evaluate(h200x1.tick(), h200x1.clock()).results[0].detail
    assert read == [777]


def test_listed_process_that_no_longer_exists(h200x8: Node, tmp_path: Path) -> None:
    probe = _probe(_proc_for(h200x8, tmp_path, without=(41003,)), gone_samples=2)
    assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()  # one sample could be an exit race
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "process_gone")
    assert f.gpu is not None
    assert f.gpu.index == 2
    assert f.evidence["pid"] == "41003"
    assert status(probe.evaluate(h200x8.tick(), h200x8.clock()), 2) == "warning"


def test_steady_growth_of_one_process_warns(h200x1: Node) -> None:
    probe = _probe(None, growth_window_seconds=600, growth_min_mib=1024, growth_min_samples=5)
    report = None
    for i in range(12):  # +256 MiB a minute for 11 minutes
        if i:
            h200x1.inject("process_exit", 0, pid=900)
        h200x1.inject("process_start", 0, pid=900, name="leaky", memory_mib=1024 + 256 * i)
        report = probe.evaluate(h200x1.tick(60), h200x1.clock())
    assert report is not None
    f = only(report, "process_memory_growth")
    assert (f.severity, f.action) == (Severity.WARNING, Action.NONE)
    assert "leaky" in f.message


def test_growth_that_plateaus_or_shrinks_does_not_warn(h200x1: Node) -> None:
    probe = _probe(None, growth_window_seconds=600, growth_min_mib=1024, growth_min_samples=5)
    sizes = [1024, 4096, 8192, 8192, 2048] + [8192] * 20  # allocator warm-up, a free, then a plateau
    for i, size in enumerate(sizes):
        if i:
            h200x1.inject("process_exit", 0, pid=900)
        h200x1.inject("process_start", 0, pid=900, name="trainer", memory_mib=size)
        assert codes(probe.evaluate(h200x1.tick(60), h200x1.clock())) == set()


def test_stale_gpu_is_unknown(h200x8: Node) -> None:
    h200x8.inject("gpu_lost", 1)
    report = _probe(None).evaluate(h200x8.tick(), h200x8.clock())
    assert status(report, 1) == "unknown"


def test_an_unknown_process_list_is_unknown_not_unowned_memory(h200x8: Node, tmp_path: Path) -> None:
    """A refused process listing (NO_PERMISSION on a MIG card) must not make the card's memory look unowned."""
    probe = _probe(_proc_for(h200x8, tmp_path), orphan_samples=1)
    real = h200x8.backend.processes

    def refused(index: int) -> tuple[GpuProcess, ...]:
        if index == 4:
            raise BackendError(
                "Insufficient Permissions", call="nvmlDeviceGetComputeRunningProcesses", code="no_permission"
            )
        return real(index)

    h200x8.backend.processes = refused  # type: ignore[method-assign]
    h200x8.inject("orphan_memory", 4, memory_mib=4096)
    snap = h200x8.tick()
    card = snap.gpu(4)
    assert card is not None and card.fresh and not card.processes_known, "the card stays fresh, its processes unknown"
    report = probe.evaluate(snap, h200x8.clock())
    assert codes(report, 4) == set()
    assert status(report, 4) == "unknown"


class _Stats:
    """Counts the stats of /proc/<pid> the probe makes (os.path.exists), passing them through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = os.path.exists

        def exists(path: str) -> bool:
            self.paths.append(path)
            return real(path)

        monkeypatch.setattr(os.path, "exists", exists)  # the probe calls os.path.exists


def test_one_listing_of_proc_finds_a_gone_pid_after_exactly_gone_samples(
    h200x8: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc holds little besides the listed pids: it is listed once per evaluation, and only the pid missing from
    the listing is stat'ed."""
    proc = _proc_for(h200x8, tmp_path, without=(41003,))
    stats = _Stats(monkeypatch)
    probe = _probe(proc, gone_samples=3)
    for i in range(4):
        report = probe.evaluate(h200x8.tick(), h200x8.clock())
        assert (codes(report) == {"process_gone"}) == (i >= 2)
    assert stats.paths == [f"{proc}/41003"] * 4
    assert only(report, "process_gone").evidence["samples"] == "4"


def test_a_reused_pid_starts_the_count_over(h200x8: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pid leaves /proc, and before it has been missing for gone_samples another process gets it: the count
    starts over, and the pid is reported only after it has been missing gone_samples samples in a row again."""
    proc = _proc_for(h200x8, tmp_path, without=(41003,))
    _Stats(monkeypatch)
    probe = _probe(proc, gone_samples=3)
    missing = [True, True, False, True, True, True]
    for i, gone in enumerate(missing):
        if gone:
            shutil.rmtree(proc / "41003", ignore_errors=True)
        else:
            (proc / "41003").mkdir(exist_ok=True)
        assert (codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == {"process_gone"}) == (i == 5)


def test_in_a_crowded_proc_each_pid_is_checked_with_a_stat(
    h200x8: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc with many more entries than listed pids: after the first evaluation lists it, each pid is stat'ed."""
    proc = _proc_for(h200x8, tmp_path, without=(41003,))
    for n in range(1, 200):
        (proc / str(n)).mkdir()
    stats = _Stats(monkeypatch)
    probe = _probe(proc, gone_samples=2)
    listed = sum(len(g.processes) for g in h200x8.tick().gpus)
    assert listed * 2 < 200
    for i in range(3):
        assert (codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == {"process_gone"}) == (i >= 1)
    assert len(stats.paths) == 1 + 2 * listed  # the first evaluation: the missing pid; then all of them
    assert stats.paths.count(f"{proc}/41003") == 3
