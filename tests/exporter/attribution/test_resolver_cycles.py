"""The resolver checks a known PID's start time once every N cycles only: a PID reused by a new process is still
caught within N cycles, one that left the cards is read again at once when it comes back, and one whose /proc
entry vanished resolves to nothing within N cycles."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.attribution.resolver import ProcResolver

N = 4
PIDS = range(100, 108)  # eight consecutive PIDs: two fall due in each of the N cycles


def _write(root: Path, pid: int, start: int, comm: str) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{start} 0 0\n")
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text("0::/system.slice/train.service\n")


def _remove(root: Path, pid: int) -> None:
    d = root / str(pid)
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def _comm(resolver: ProcResolver, pid: int) -> str | None:
    identity = resolver.resolve(pid)
    return None if identity is None else identity.comm


def test_a_reused_pid_is_caught_within_n_cycles_and_known_pids_are_not_reread(tmp_path: Path) -> None:
    for pid in PIDS:
        _write(tmp_path, pid, 1000, "old")
    resolver = ProcResolver(tmp_path, verify_every=N)
    resolver.begin_cycle()
    assert [_comm(resolver, pid) for pid in PIDS] == ["old"] * len(PIDS)  # new PIDs: read at once
    for pid in PIDS:  # every PID exits and the kernel hands it to a new process before the next sample
        _write(tmp_path, pid, 2000, "new")
    caught_at: dict[int, int] = {}
    for cycle in range(1, N + 1):
        resolver.begin_cycle()
        for pid in PIDS:
            if _comm(resolver, pid) == "new":
                caught_at.setdefault(pid, cycle)
    assert sorted(caught_at) == list(PIDS), "a reused PID kept its old owner for more than N cycles"
    # staggered: each cycle checks its share of the known PIDs, not all of them
    assert sorted(list(caught_at.values()).count(c) for c in range(1, N + 1)) == [2] * N


def test_a_pid_that_left_the_cards_is_read_again_at_once(tmp_path: Path) -> None:
    _write(tmp_path, 100, 1000, "old")
    resolver = ProcResolver(tmp_path, verify_every=N)
    for _ in range(N):  # whatever cycle it comes back in
        resolver.begin_cycle()
        assert _comm(resolver, 100) == "old"
        resolver.retain([])  # it left every card (the process exited)
        assert resolver.cached == 0
        _write(tmp_path, 100, 2000, "new")  # the PID's next owner opens a card
        resolver.begin_cycle()
        assert _comm(resolver, 100) == "new"
        resolver.retain([])
        _write(tmp_path, 100, 1000, "old")


def test_a_vanished_pid_resolves_to_nothing_within_n_cycles(tmp_path: Path) -> None:
    for pid in PIDS:
        _write(tmp_path, pid, 1000, "old")
    resolver = ProcResolver(tmp_path, verify_every=N)
    resolver.begin_cycle()
    for pid in PIDS:
        assert resolver.resolve(pid) is not None
    for pid in PIDS:  # gone from /proc while the driver still lists them
        _remove(tmp_path, pid)
    for _ in range(N):
        resolver.begin_cycle()
        for pid in PIDS:
            resolver.resolve(pid)
    assert resolver.cached == 0  # each was dropped on its own due cycle, with no lookup after the N cycles


def test_verify_every_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verify_every must be at least 1"):
        ProcResolver(tmp_path, verify_every=0)
