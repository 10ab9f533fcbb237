"""The growth check keeps a running count per process instead of rescanning its window every cycle; its findings
are those of the formula it replaced (reproduced here as the reference), over any run of readings hypothesis finds:
processes appearing, growing, shrinking, stalling and leaving, with uneven sample spacing."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.backends.types import UNSUPPORTED, GpuProcess
from healthd.findings import Finding, GpuRef
from healthd.probes.memory_leak import MIB, GrowthWindow, MemoryLeakProbe, Settings

REF = GpuRef(0, "GPU-0", "0000:00:00.0")
KEY = "GPU-0"


class _RescanningGrowth:
    """The formula before the running count: the window kept as a deque and scanned on every reading."""

    def __init__(self, settings: Settings) -> None:
        self.t = settings
        self.history: dict[int, deque[tuple[float, int]]] = {}

    def evaluate(self, processes: tuple[GpuProcess, ...], now: float) -> list[tuple[int, int, int]]:
        t = self.t
        out = []
        for p in processes:
            if not isinstance(p.used_memory_bytes, int):
                continue
            history = self.history.setdefault(p.pid, deque())
            if history and p.used_memory_bytes < history[-1][1]:
                history.clear()
            history.append((now, p.used_memory_bytes))
            while len(history) > 1 and now - history[0][0] > t.growth_window_seconds:
                history.popleft()
            first_t, first = history[0]
            grown = p.used_memory_bytes - first
            steps = sum(1 for a, b in zip(history, list(history)[1:], strict=False) if b[1] > a[1])
            if (
                len(history) >= t.growth_min_samples
                and now - first_t >= 0.9 * t.growth_window_seconds
                and grown >= t.growth_min_mib * MIB
                and steps >= (len(history) - 1) // 2
            ):
                out.append((p.pid, grown, round(now - first_t)))
        live = {p.pid for p in processes}
        for pid in [pid for pid in self.history if pid not in live]:
            del self.history[pid]
        return out


def _key(f: Finding) -> tuple[int, int, int]:
    return int(f.evidence["pid"]), int(f.evidence["grown_bytes"]), int(f.evidence["seconds"])


# one sampling cycle: seconds since the previous one, and what each of 3 processes' memory does (in 256 MiB steps,
# mostly flat or up so that windows live long enough to cross the thresholds; "gone": not listed this cycle)
MOVES = {"flat": 0, "up": 1, "up2": 2, "down": -1}
CYCLE = st.tuples(
    st.sampled_from([0.0, 1.0, 5.0, 5.0, 5.0, 30.0, 90.0]),
    st.lists(
        st.sampled_from(["flat", "flat", "flat", "up", "up", "up2", "down", "gone", "unreported"]),
        min_size=3,
        max_size=3,
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(CYCLE, min_size=1, max_size=120),
    st.integers(60, 900),
    st.integers(1, 6),
    st.integers(1, 12),
)
def test_running_counts_give_the_findings_of_the_rescanning_formula(
    cycles: list[tuple[float, list[str]]], window: int, min_steps: int, min_samples: int
) -> None:
    thresholds = Settings(
        growth_window_seconds=float(window), growth_min_mib=min_steps * 256, growth_min_samples=min_samples
    )
    probe = MemoryLeakProbe(thresholds)
    reference = _RescanningGrowth(thresholds)
    now = 1000.0
    memory = [8, 8, 8]
    for dt, moves in cycles:
        now += dt
        listed = []
        for i, move in enumerate(moves):
            if move == "gone":
                continue
            if move != "unreported":
                memory[i] = max(0, memory[i] + MOVES[move])
            used = UNSUPPORTED if move == "unreported" else memory[i] * 256 * MIB
            listed.append(GpuProcess(101 + i, used, UNSUPPORTED, UNSUPPORTED, "train"))
        processes = tuple(listed)
        probe._evaluation += 1  # what evaluate does around each card: number the evaluation, then drop the unlisted
        card = probe._card(KEY)
        card.stamped = 0
        got = [_key(f) for f in probe._grow(REF, card, processes, now)]
        card.listed = [processes]
        probe._forget_unlisted(card)
        assert got == reference.evaluate(processes, now)


# a step of memory: mostly flat, sometimes up, rarely down (a drop starts the window over, so drops must be rare
# for readings to leave a window by the hundred and the arrays to be cut)
STEP = st.integers(0, 60).map(lambda n: 0 if n < 45 else 1 if n < 58 else 3 if n < 60 else -1)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.0, 1.0, 5.0, 5.0, 60.0]), STEP), min_size=150, max_size=400),
    st.integers(10, 300),
)
def test_the_window_holds_what_the_rescanned_deque_held(moves: list[tuple[float, int]], window: int) -> None:
    """After every reading: as many readings, the same oldest one and as many steps up as the deque kept (which add
    returns too)."""
    compact, history = GrowthWindow(), deque[tuple[float, int]]()
    now, used = 0.0, 100
    for dt, step in moves:
        now, used = now + dt, max(0, used + step)
        returned = compact.add(now, used, float(window))
        if history and used < history[-1][1]:
            history.clear()
        history.append((now, used))
        while len(history) > 1 and now - history[0][0] > window:
            history.popleft()
        steps = sum(1 for a, b in zip(history, list(history)[1:], strict=False) if b[1] > a[1])
        assert (len(compact), compact.first, compact.steps, returned) == (len(history), history[0], steps, steps)


def test_the_window_counts_steps_up_and_forgets_what_left_it() -> None:
    window = GrowthWindow()
    for now, used in ((0.0, 1), (10.0, 1), (20.0, 2), (30.0, 3), (40.0, 3)):
        window.add(now, used, 100.0)
    assert (len(window), window.steps, window.first) == (5, 2, (0.0, 1))
    window.add(
        125.0, 4, 100.0
    )  # the readings at 0, 10 and 20 s fall out: the steps 1 -> 2 -> 3 go with them, 3 -> 4 comes
    assert (len(window), window.steps, window.first) == (3, 1, (30.0, 3))
    window.add(130.0, 2, 100.0)  # it shrank: start over
    assert (len(window), window.steps, window.first) == (1, 0, (130.0, 2))
