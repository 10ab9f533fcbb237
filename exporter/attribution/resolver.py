"""PID -> process name and cgroup owner, read from a proc root and cached per (pid, start time).

The cache is keyed by the process start time (field 22 of /proc/<pid>/stat), so a PID the kernel reuses for a new
process is resolved again instead of inheriting the old owner. Each lookup of a known process costs one small
read (stat); cgroup and comm are read once per process lifetime.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.attribution.cgroup import HOST, CgroupOwner, parse_cgroup_file

log = structlog.get_logger("attribution")


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    pid: int
    start_time: int  # clock ticks after boot
    comm: str  # /proc/<pid>/comm, "" when unreadable
    owner: CgroupOwner
    cgroup_readable: bool = True


class ProcResolver:
    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._cache: dict[int, ProcessIdentity] = {}
        self._warned_unreadable = False

    def resolve(self, pid: int) -> ProcessIdentity | None:
        """None when the process is gone (or never existed under this proc root)."""
        base = self.proc_root / str(pid)
        start = _start_time(base / "stat")
        if start is None:
            self._cache.pop(pid, None)
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached.start_time == start:
            return cached
        comm = _read(base / "comm").strip()
        text = _read(base / "cgroup")
        readable = bool(text)
        if not readable and not self._warned_unreadable:
            self._warned_unreadable = True
            log.warning("cannot read a process's cgroup; its container and pod stay unknown", pid=pid, path=str(base))
        identity = ProcessIdentity(pid, start, comm, parse_cgroup_file(text) if text else HOST, readable)
        self._cache[pid] = identity
        return identity

    def retain(self, pids: Iterable[int]) -> None:
        """Drop cache entries of processes no longer on any GPU (bounded memory)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    @property
    def cached(self) -> int:
        return len(self._cache)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _start_time(stat_path: Path) -> int | None:
    text = _read(stat_path)
    # comm (field 2) may hold spaces and parentheses: fields after the last ')' start at field 3 (state)
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 1 :].split()
    try:
        return int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None
