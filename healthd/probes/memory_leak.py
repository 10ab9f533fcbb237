"""GPU memory leaks: device memory no live process owns, processes NVML lists that no longer exist, and one
process's memory growing steadily (a warning only).

No anchor (GPUd, NVSentinel, DCGM, NPD) checks this, so the thresholds are ours and conservative. False positives
avoided: memory the driver reserves (NVML v2 reports it apart; with v1 an allowance is subtracted), processes
just starting or exiting (every condition must hold for several samples), MPS (NVML lists only the MPS server and
none of its clients' memory, measured on the H200, so unowned memory is expected there: the orphan check is off on a
card running an MPS server), and cards whose driver does not report per-process memory (unsupported).
The pid check needs the host pid namespace (the daemon runs as a host service); ``proc_root`` None turns it off.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass
from pathlib import Path

from exporter.attribution.resolver import is_mps_server
from exporter.backends.types import GpuProcess, Unsupported
from exporter.settings import option
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import Action, CheckStatus, Finding, GpuRef, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "memory_leak"
SECTION = "memory_leak"
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.memory_leak]: sizes in MiB."""

    orphan_min_mib: int = option(1024, min=1)  # unowned memory smaller than this is left alone
    orphan_samples: int = option(6, min=1)  # consecutive samples (30 s at the default 5 s interval)
    gone_samples: int = option(6, min=1)  # a listed pid missing from /proc this many samples in a row
    # NVML v1 folds driver-reserved memory (616 MiB on the H200) into "used"; this much of it is allowed for
    legacy_reserved_mib: int = option(1024, min=0)
    growth_window_seconds: float = option(1800.0, above=0)
    growth_min_mib: int = option(2048, min=1)
    growth_min_samples: int = option(10, min=1)


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


class _Card:
    """One card's per-process state, keyed by pid: consecutive samples missing from /proc, and growth windows."""

    __slots__ = ("gone", "growth", "keep_all", "listed", "stamped")

    def __init__(self) -> None:
        self.gone: dict[int, int] = {}
        self.growth: dict[int, GrowthWindow] = {}
        self.listed: list[tuple[GpuProcess, ...]] = []  # this evaluation's listings of the card
        self.stamped = 0  # growth windows stamped with this evaluation's number
        self.keep_all = False  # the card's process list was unknown this evaluation: keep everything


class MemoryLeakProbe:
    """``proc_root`` None: no pid liveness check and no process names from /proc.

    Per card, state is kept by pid and dropped once the card stops listing the pid (or the card is not fresh): a
    window is stamped with the evaluation's number when its pid is listed, and the card's windows are scanned for
    unstamped ones only when fewer were stamped than the card keeps."""

    name = CHECK

    def __init__(self, settings: Settings | None = None, *, proc_root: Path | None = None) -> None:
        self.settings = settings or Settings()
        self.proc_root = proc_root
        self._proc = (
            None if proc_root is None else os.fspath(proc_root)
        )  # read with os calls: every process, every cycle
        self._orphan_streak: dict[str, int] = {}
        self._cards: dict[str, _Card] = {}
        self._evaluation = 0
        # entries in the last listing of proc_root (none yet: the first evaluation with processes lists it): listing
        # costs about one stat per two entries (measured on /proc), so it replaces the stats while more pids are
        # to be checked than half of that
        self._proc_entries = 0
        self._listing: frozenset[str] | None = None  # this evaluation's listing of proc_root, taken when first needed
        self._to_check = 0  # pids the evaluation checks in /proc: the fresh cards' listed processes

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        self._evaluation += 1
        self._listing = None
        if self._proc is not None:
            self._to_check = sum(len(g.processes) for g in snapshot.gpus if g.fresh)
        seen: dict[str, _Card] = {}
        for g, ref, _ in report.fresh_cards(snapshot):
            key = g.uuid or str(g.index)
            card = self._card(key)
            if key not in seen:
                seen[key] = card
                card.listed.clear()
                card.stamped = 0
                card.keep_all = False
            if not g.processes_known:  # without the process list, all memory would look unowned
                report.result(ref, CheckStatus.UNKNOWN, f"process list unknown: {g.partial_errors['processes']}")
                card.keep_all = True
                continue
            card.listed.append(g.processes)
            findings, note = self._orphan(ref, key, g)
            findings += self._gone(ref, card, g.processes)
            findings += self._grow(ref, card, g.processes, now)
            report.gpu_done(ref, findings, note)
        for key in [k for k in self._cards if k not in seen]:
            del self._cards[key]
        for card in seen.values():
            self._forget_unlisted(card)
        self._listing = None
        return report.build()

    def _card(self, key: str) -> _Card:
        card = self._cards.get(key)
        if card is None:
            card = self._cards[key] = _Card()
        return card

    def _forget_unlisted(self, card: _Card) -> None:
        """Drop the state of pids none of this evaluation's listings of the card had."""
        if card.keep_all:
            return
        if len(card.growth) != card.stamped:
            evaluation = self._evaluation
            for pid in [pid for pid, w in card.growth.items() if w.seen != evaluation]:
                del card.growth[pid]
        if card.gone:
            listed = {p.pid for processes in card.listed for p in processes}
            for pid in [pid for pid in card.gone if pid not in listed]:
                del card.gone[pid]

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
        owned = 0
        mps = nameless = False
        for p in g.processes:  # one pass: memory owned, an MPS server by its listed name, names to read from /proc
            used = p.used_memory_bytes
            if isinstance(used, Unsupported):
                self._orphan_streak.pop(key, None)
                return [], "per-process memory not reported: unowned memory cannot be measured"
            owned += used
            if p.name:
                mps = mps or is_mps_server(p.name)
            else:
                nameless = True
        reserved = g.sample.memory_reserved_bytes
        allowance = t.legacy_reserved_mib * MIB if isinstance(reserved, Unsupported) else 0
        orphan = g.sample.memory_used_bytes - owned - allowance
        if orphan < t.orphan_min_mib * MIB:
            self._orphan_streak.pop(key, None)
            return [], f"{_mib(g.sample.memory_used_bytes)} used, {len(g.processes)} process(es) own {_mib(owned)}"
        # names from /proc only for a card with unowned memory: a real node's NVML lists none, and reading every
        # process's comm every cycle would cost some 17 ms at 3,200 processes
        if not mps and nameless and self._proc is not None:
            mps = any(is_mps_server(self._name(p)) for p in g.processes if not p.name)
        if mps:
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

    def _alive(self) -> frozenset[str] | None:
        """This evaluation's listing of proc_root when listing it costs less than a stat of each pid to check; None:
        stat each. A pid missing from the listing is still stat'ed, so a pid counts as gone exactly when the stat
        fails, as without the listing."""
        if self._listing is None and self._to_check * 2 > self._proc_entries:
            assert self._proc is not None
            try:
                self._listing = frozenset(os.listdir(self._proc))
            except OSError:
                return None
            self._proc_entries = len(self._listing)
        return self._listing

    def _gone(self, ref: GpuRef, card: _Card, processes: tuple[GpuProcess, ...]) -> list[Finding]:
        root = self._proc
        if root is None or not processes:
            return []
        listing = self._alive() or frozenset()
        out: list[Finding] = []
        gone = card.gone
        for p in processes:
            if str(p.pid) in listing or os.path.exists(f"{root}/{p.pid}"):
                if gone:
                    gone.pop(p.pid, None)
                continue
            streak = gone[p.pid] = gone.get(p.pid, 0) + 1
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

    def _grow(self, ref: GpuRef, card: _Card, processes: tuple[GpuProcess, ...], now: float) -> list[Finding]:
        t = self.settings
        out: list[Finding] = []
        growth = card.growth
        evaluation = self._evaluation
        window_seconds = t.growth_window_seconds
        stamped = 0  # windows stamped here, added to the card's count once
        for p in processes:
            window = growth.get(p.pid)
            used = p.used_memory_bytes
            if not isinstance(used, int):
                if window is not None and window.seen != evaluation:  # listed: its window stays
                    window.seen = evaluation
                    stamped += 1
                continue
            if window is None:
                window = growth[p.pid] = GrowthWindow()
            if window.seen != evaluation:
                window.seen = evaluation
                stamped += 1
            steps = window.add(now, used, window_seconds)
            if not steps:
                continue  # one run of equal readings: it has not grown (the usual case, checked first)
            first_t, first = window.first
            grown = used - first
            # steady: never shrank over the window, grew in most steps, spans most of the window
            if (
                len(window) >= t.growth_min_samples
                and now - first_t >= 0.9 * window_seconds
                and grown >= t.growth_min_mib * MIB
                and steps >= (len(window) - 1) // 2
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
        card.stamped += stamped
        return out


class GrowthWindow:
    """One process's memory readings over the growth window, kept compact and counted as they come: adding a
    reading costs O(1) amortised, not a scan of the window, and takes 8 bytes (its time) when the memory stays put,
    24 when it moved, rather than a tuple of two objects (about 120 bytes).

    The readings never go down (a drop starts the window over), so they form runs of equal values: ``_values`` and
    ``_counts`` hold each run's value and number of readings, and the steps up are the runs after the first. Items
    before ``_time0`` and ``_run0`` have left the window; they are cut off now and then."""

    __slots__ = ("_counts", "_run0", "_time0", "_times", "_values", "seen")

    def __init__(self) -> None:
        self._restart()
        self.seen = 0  # the number of the last evaluation that listed its process (MemoryLeakProbe's bookkeeping)

    def _restart(self) -> None:
        self._times = array("d")  # every reading's time, oldest first
        self._values = array("q")  # each run's value, oldest first
        self._counts = array("q")  # each run's readings
        self._time0 = self._run0 = 0

    def add(self, now: float, used: int, window_seconds: float) -> int:
        """Add a reading; returns the steps up in the window after it (:attr:`steps`), which the caller checks
        first: 0, one run of equal readings, is the usual case and cannot be growth."""
        values = self._values
        if values and used == values[-1]:  # the usual case: the memory stayed put
            times = self._times
            times.append(now)
            time0 = self._time0
            if now - times[time0] <= window_seconds:
                self._counts[-1] += 1
                return len(values) - self._run0 - 1  # nothing left the window
            if self._run0 == len(values) - 1 and now - times[time0 + 1] <= window_seconds:
                # the usual case at steady state (the window full): one run, and the reading that came replaces
                # the one that left, so the run's count stays; what _leave would do, without its walk
                time0 += 1
                if time0 > 64 and time0 * 2 > len(times):
                    del times[:time0]
                    del values[: self._run0]
                    del self._counts[: self._run0]
                    self._run0 = time0 = 0
                self._time0 = time0
                return 0
            self._counts[-1] += 1
            return self._leave(now, window_seconds)
        if values and used < values[-1]:
            self._restart()  # it freed memory: not a steady leak, start over
            values = self._values
        values.append(used)
        self._counts.append(1)
        times = self._times
        times.append(now)
        if now - times[self._time0] <= window_seconds:
            return len(values) - self._run0 - 1  # nothing left the window
        return self._leave(now, window_seconds)

    def _leave(self, now: float, window_seconds: float) -> int:
        """The readings that left the window with the one at ``now`` go; returns the steps up left in it."""
        times, values, counts = self._times, self._values, self._counts
        time0 = self._time0
        run0 = self._run0
        newest = len(times) - 1
        while time0 < newest and now - times[time0] > window_seconds:
            time0 += 1
            counts[run0] -= 1
            if not counts[run0]:
                run0 += 1
        if time0 > 64 and time0 * 2 > len(times):  # cut off what left the window, now and then
            del times[:time0]
            del values[:run0]
            del counts[:run0]
            time0 = run0 = 0
        self._time0, self._run0 = time0, run0
        return len(values) - run0 - 1

    @property
    def steps(self) -> int:
        """Readings above the one before them, within the window."""
        return len(self._values) - self._run0 - 1

    @property
    def first(self) -> tuple[float, int]:
        return self._times[self._time0], self._values[self._run0]

    def __len__(self) -> int:
        return len(self._times) - self._time0


def build(settings: Settings, host: ProbeHost) -> MemoryLeakProbe:
    return MemoryLeakProbe(settings, proc_root=host.proc_root)
