"""What every bench module shares: the Row it reports, the arguments it gets, small statistics and /proc readers.

A bench module is any module with ``NAME: str`` and ``run(args: BenchArgs) -> list[Row]``; ``bench/run_all.py``
lists them in one registry and prints every Row in one table.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Row:
    """One measured number, at one point of the growth curve.

    ``metric`` names what was measured (rows with the same metric, processes and pods share a table line, one
    column per GPU count); ``value`` is in ``unit``. ``gpus``/``processes``/``pods`` place it on the curve
    (None: that axis does not apply). ``processes`` and ``pods`` count per node, not per GPU.
    """

    metric: str
    unit: str
    value: float
    gpus: int | None = None
    processes: int | None = None
    pods: int | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class BenchArgs:
    """What run_all passes to every module; a module uses the fields it needs and ignores the rest."""

    quick: bool = False
    gpu_counts: tuple[int, ...] = (1, 8, 16, 64)
    processes_per_gpu: tuple[int, ...] = (0, 10, 50)
    pods_per_gpu: tuple[int, ...] = (0, 4)
    daemon_seconds: float = 60.0
    daemon_gpu_counts: tuple[int, ...] = (1, 8, 64)
    scrapes: int = 300
    cycles: int = 100
    work_dir: Path = field(default_factory=lambda: Path("/tmp"))


class SkipBench(Exception):  # noqa: N818 - raised to say "not measured here", not an error
    """A module cannot measure here (missing feature, tool or hardware); the message says why."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..1."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Seconds each of ``n`` back-to-back calls of ``fn`` took."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def free_port() -> int:
    """A loopback TCP port free right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int, proc_root: Path = Path("/proc")) -> float:
    """User + system CPU time of a process (all its threads) from /proc/<pid>/stat."""
    text = (proc_root / str(pid) / "stat").read_text()
    # the command name is in parentheses and may hold spaces: split after the last ')'
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5), counted from state (3)
    return (utime + stime) / CLOCK_TICKS


def proc_status_kib(pid: int | str, key: str, proc_root: Path = Path("/proc")) -> int:
    """A ``kB`` line of /proc/<pid>/status (VmRSS, VmHWM, ...), in KiB; also reads a plain count (Threads)."""
    for line in (proc_root / str(pid) / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def rss_mib(pid: int | str = "self") -> float:
    return proc_status_kib(pid, "VmRSS") / 1024
