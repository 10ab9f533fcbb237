"""The memory-leak probe as it was before its per-cycle cost was cut (commit e8173d5): one stat of /proc/<pid> per
listed process, state keyed by (card, pid) and dropped through per-card sets. test_memory_leak_equivalence.py checks
that the probe gives this one's reports over any sequence of snapshots."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

from exporter.attribution.resolver import is_mps_server
from exporter.backends.types import GpuProcess, Unsupported
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import Action, CheckStatus, Finding, GpuRef, ProbeReport, Severity
from healthd.probes.common import ReportBuilder, evidence
from healthd.probes.memory_leak import CHECK, MIB, Settings, _mib


class ReferenceMemoryLeakProbe:
    """``proc_root`` None: no pid liveness check and no process names from /proc."""

    name = CHECK

    def __init__(self, settings: Settings | None = None, *, proc_root: Path | None = None) -> None:
        self.settings = settings or Settings()
        self.proc_root = proc_root
        self._proc = (
            None if proc_root is None else os.fspath(proc_root)
        )  # read with os calls: every process, every cycle
        self._orphan_streak: dict[str, int] = {}
        self._gone_streak: dict[tuple[str, int], int] = {}
        self._growth: dict[tuple[str, int], GrowthWindow] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        live: set[tuple[str, int]] = set()
        for g, ref, _ in report.fresh_cards(snapshot):
            key = g.uuid or str(g.index)
            if not g.processes_known:  # without the process list, all memory would look unowned
                report.result(ref, CheckStatus.UNKNOWN, f"process list unknown: {g.partial_errors['processes']}")
                live |= {k for k in self._gone_streak if k[0] == key} | {k for k in self._growth if k[0] == key}
                continue
            live |= {(key, p.pid) for p in g.processes}
            findings, note = self._orphan(ref, key, g)
            findings += self._gone(ref, key, g.processes)
            findings += self._grow(ref, key, g.processes, now)
            report.gpu_done(ref, findings, note)
        for table in (self._gone_streak, self._growth):
            for k in [k for k in table if k not in live]:
                del table[k]
        return report.build()

    def _name(self, p: GpuProcess) -> str:
        if p.name or self._proc is None:
            return p.name
        try:
            fd = os.open(f"{self._proc}/{p.pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            return os.read(fd, 256).decode(errors="replace").strip()  # comm is at most 16 bytes
        except OSError:
            return ""
        finally:
            os.close(fd)

    def _orphan(self, ref: GpuRef, key: str, g: GpuSnapshot) -> tuple[list[Finding], str]:
        t = self.settings
        assert g.sample is not None
        if any(isinstance(p.used_memory_bytes, Unsupported) for p in g.processes):
            self._orphan_streak.pop(key, None)
            return [], "per-process memory not reported: unowned memory cannot be measured"
        owned = sum(p.used_memory_bytes for p in g.processes if isinstance(p.used_memory_bytes, int))
        reserved = g.sample.memory_reserved_bytes
        allowance = t.legacy_reserved_mib * MIB if isinstance(reserved, Unsupported) else 0
        orphan = g.sample.memory_used_bytes - owned - allowance
        if orphan < t.orphan_min_mib * MIB:
            self._orphan_streak.pop(key, None)
            return [], f"{_mib(g.sample.memory_used_bytes)} used, {len(g.processes)} process(es) own {_mib(owned)}"
        if any(is_mps_server(self._name(p)) for p in g.processes):
            self._orphan_streak.pop(key, None)
            return [], "MPS server running: client memory is not listed per process"
        streak = self._orphan_streak[key] = self._orphan_streak.get(key, 0) + 1
        if streak < t.orphan_samples:
            return [], (
                f"{_mib(orphan)} not owned by any listed process in {streak} sample(s) in a row; "
                f"reported after {t.orphan_samples}"
            )
        return [
            Finding(
                CHECK,
                "memory_unowned",
                Severity.WARNING,
                Action.RESET_GPU,  # only a reset (or the owner's exit) returns memory no listed process holds
                f"{_mib(orphan)} of GPU memory is used but owned by no listed process (for {streak} samples)",
                ref,
                evidence(
                    unowned_bytes=orphan, used_bytes=g.sample.memory_used_bytes, owned_bytes=owned, samples=streak
                ),
            )
        ], ""

    def _gone(self, ref: GpuRef, key: str, processes: tuple[GpuProcess, ...]) -> list[Finding]:
        root = self._proc
        if root is None:
            return []
        out: list[Finding] = []
        for p in processes:
            if os.path.exists(f"{root}/{p.pid}"):
                self._gone_streak.pop((key, p.pid), None)
                continue
            streak = self._gone_streak[(key, p.pid)] = self._gone_streak.get((key, p.pid), 0) + 1
            if streak < self.settings.gone_samples:
                continue
            held = p.used_memory_bytes if isinstance(p.used_memory_bytes, int) else 0
            out.append(
                Finding(
                    CHECK,
                    "process_gone",
                    Severity.WARNING,
                    Action.RESET_GPU,
                    f"pid {p.pid} holds {_mib(held)} on the GPU but no longer exists",
                    ref,
                    evidence(pid=p.pid, used_bytes=held, samples=streak),
                )
            )
        return out

    def _grow(self, ref: GpuRef, key: str, processes: tuple[GpuProcess, ...], now: float) -> list[Finding]:
        t = self.settings
        out: list[Finding] = []
        for p in processes:
            used = p.used_memory_bytes
            if not isinstance(used, int):
                continue
            window = self._growth.get((key, p.pid))
            if window is None:
                window = self._growth[(key, p.pid)] = GrowthWindow()
            window.add(now, used, t.growth_window_seconds)
            first_t, first = window.first
            grown = used - first
            # steady: never shrank over the window, grew in most steps, spans most of the window
            if (
                len(window) >= t.growth_min_samples
                and now - first_t >= 0.9 * t.growth_window_seconds
                and grown >= t.growth_min_mib * MIB
                and window.steps >= (len(window) - 1) // 2
            ):
                out.append(
                    Finding(
                        CHECK,
                        "process_memory_growth",
                        Severity.WARNING,
                        Action.NONE,
                        f"pid {p.pid} ({self._name(p) or 'unknown'}) grew by {_mib(grown)} over "
                        f"{now - first_t:.0f}s without ever shrinking",
                        ref,
                        evidence(pid=p.pid, grown_bytes=grown, seconds=round(now - first_t)),
                    )
                )
        return out


class GrowthWindow:
    """One process's memory readings over the growth window, kept compact and counted as they come: adding a
    reading costs O(1) amortised, not a scan of the window, and takes 8 bytes (its time) when the memory stays put,
    24 when it moved, rather than a tuple of two objects (about 120 bytes).

    The readings never go down (a drop starts the window over), so they form runs of equal values: ``_values`` and
    ``_counts`` hold each run's value and number of readings, and the steps up are the runs after the first. Items
    before ``_time0`` and ``_run0`` have left the window; they are cut off now and then."""

    __slots__ = ("_counts", "_run0", "_time0", "_times", "_values")

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self._times = array("d")  # every reading's time, oldest first
        self._values = array("q")  # each run's value, oldest first
        self._counts = array("q")  # each run's readings
        self._time0 = self._run0 = 0

    def add(self, now: float, used: int, window_seconds: float) -> None:
        values, counts = self._values, self._counts
        if len(values) > self._run0 and used < values[-1]:
            self._restart()  # it freed memory: not a steady leak, start over
            values, counts = self._values, self._counts
        if len(values) > self._run0 and used == values[-1]:
            counts[-1] += 1
        else:
            values.append(used)
            counts.append(1)
        times = self._times
        times.append(now)
        while len(times) - self._time0 > 1 and now - times[self._time0] > window_seconds:
            self._time0 += 1
            counts[self._run0] -= 1
            if not counts[self._run0]:
                self._run0 += 1
        if self._time0 > 64 and self._time0 * 2 > len(times):  # cut off what left the window, now and then
            del times[: self._time0]
            del values[: self._run0]
            del counts[: self._run0]
            self._time0 = self._run0 = 0

    @property
    def steps(self) -> int:
        """Readings above the one before them, within the window."""
        return len(self._values) - self._run0 - 1

    @property
    def first(self) -> tuple[float, int]:
        return self._times[self._time0], self._values[self._run0]

    def __len__(self) -> int:
        return len(self._times) - self._time0
