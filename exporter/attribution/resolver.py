"""PID -> process name and cgroup owner, read from a proc root and cached per (pid, start time).

The cache is keyed by the process start time (field 22 of /proc/<pid>/stat), so a PID the kernel reuses for a new
process is resolved again instead of inheriting the old owner. A PID new to the cache is read whole (stat, comm,
cgroup); a known one has its start time checked once every ``verify_every`` cycles only, staggered by PID so each
cycle checks about 1/N of them. A PID that leaves every card is dropped (``retain``), so one reused after a gap of
a cycle is new again and read at once; only a PID reused between two samples keeps its old owner, for at most N
cycles. Files are read with ``os`` calls (no pathlib on this path: it runs for every process every cycle).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.attribution.cgroup import HOST, CgroupOwner, parse_cgroup_file

log = structlog.get_logger("attribution")

VERIFY_EVERY_CYCLES = 4  # a known PID's start time is checked every 4th cycle (20 s at the default 5 s interval)
MPS_SERVER = "nvidia-cuda-mps-server"
COMM_BYTES = 15  # /proc/<pid>/comm keeps a task's name cut to 15 bytes (the kernel's TASK_COMM_LEN, 16, with a NUL)
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    pid: int
    start_time: int  # clock ticks after boot
    comm: str  # /proc/<pid>/comm, "" when unreadable
    owner: CgroupOwner
    cgroup_readable: bool = True


class ProcResolver:
    def __init__(self, proc_root: Path = Path("/proc"), *, verify_every: int = VERIFY_EVERY_CYCLES) -> None:
        if verify_every < 1:
            raise ValueError(f"verify_every must be at least 1, got {verify_every}")
        self.proc_root = proc_root
        self.verify_every = verify_every
        self._root = os.fspath(proc_root)
        self._cycle = 0
        self._cache: dict[int, ProcessIdentity] = {}
        self._warned_unreadable = False

    def begin_cycle(self) -> None:
        """One sampling cycle starts: known PIDs due this cycle get their start time checked."""
        self._cycle += 1

    def resolve(self, pid: int) -> ProcessIdentity | None:
        """None when the process is gone (or never existed under this proc root)."""
        cached = self._cache.get(pid)
        if cached is not None and (self._cycle + pid) % self.verify_every != 0:
            return cached
        base = f"{self._root}/{pid}"
        start = _start_time(_read_bytes(base + "/stat"))
        if start is None:
            self._cache.pop(pid, None)
            return None
        if cached is not None and cached.start_time == start:
            return cached
        comm = _read(base + "/comm").strip()
        text = _read(base + "/cgroup")
        readable = bool(text)
        if not readable and not self._warned_unreadable:
            self._warned_unreadable = True
            log.warning("cannot read a process's cgroup; its container and pod stay unknown", pid=pid, path=base)
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


def is_mps_server(name: str) -> bool:
    """The MPS server, by its name as a backend lists it or as /proc/<pid>/comm keeps it ("nvidia-cuda-mps": the
    real NVML lists no names, so that is the name a real node sees). The control daemon's comm is the same 15 bytes,
    but it opens no context on a card, so the driver never lists it as a card's process."""
    return name == MPS_SERVER or name == MPS_SERVER[:COMM_BYTES]


def _read(path: str) -> str:
    return _read_bytes(path).decode(errors="replace")


def _read_bytes(path: str) -> bytes:
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return b""
    try:
        data = os.read(fd, _CHUNK)
        if len(data) < _CHUNK:  # /proc hands a small file over in one read: no second call for the EOF
            return data
        chunks = [data]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
            if len(chunk) < _CHUNK:
                break
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)


def _start_time(stat: bytes) -> int | None:
    """Field 22 of /proc/<pid>/stat, parsed as bytes (no decoding: it runs for 1/N of the known PIDs every cycle)."""
    # comm (field 2) may hold spaces and parentheses: fields after the last ')' start at field 3 (state). Split
    # off the first 20 of them only (field 22 is the 20th, the rest one piece): the line has 52 fields, and
    # building all of them was two thirds of the parse
    close = stat.rfind(b")")
    if close < 0:
        return None
    fields = stat[close + 1 :].split(None, 20)
    try:
        return int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None
