"""One render of /metrics from one Snapshot: every collector, timed, into sections of text kept between renders.

``SnapshotRenderer.render(snapshot)`` is a function of the Snapshot it is handed (and of the collectors' own
state: faults, partitions, attribution, topology), never of what the sampler holds now. Collectors that write
series (``exporter/collectors/series.py``) hand their keys and values straight to it: each block's lines are kept
under the block's version, so an unchanged card, pod or topology costs its kept lists of lines, and a changed one
formats only the values that changed. A render's text is kept once, as those lines: sections hold the blocks'
lists and only the encoder joins them, into the body. Collectors that still return prometheus_client families go through
``MetricLines`` (exporter/encoding.py), which keeps their lines the same way, family by family.

As node_exporter does, a collector that fails costs only its own series: ``xpu_collector_success`` says 0 and the
rest of the render goes out.

``render(snapshot, checkpoint)`` calls ``checkpoint`` before each collector and each block a collector writes (a
card, a pod: well under a millisecond of work each). The exposition cache passes one that waits while the HTTP
server answers a request (exporter/inflight.py), so a scrape does not queue for the GIL behind the whole render.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from math import copysign

import structlog
from prometheus_client.core import Metric

from exporter.collectors.base import DURATION, SUCCESS, Collector, NoDataError, SnapshotExporter
from exporter.collectors.series import Family, Rows, SeriesCollector
from exporter.encoding import MetricLines, Rendered, Section, go_exponent, go_float, series_prefix
from exporter.snapshot import Snapshot

log = structlog.get_logger("collectors")

# A series' line as the last render left it: (the whole line 'name{labels} value\n', its value, the length of its
# prefix 'name{labels} '), by its label values (or (label names, label values)), per family. The prefix is not kept
# apart: a changed value is written after line[:length]. Only strings and numbers: the garbage collector stops
# tracking such tuples and dicts, so a large node's kept lines cost it no time.
_Line = tuple[str, float, int]
_Lines = dict[Family, dict[tuple[object, ...], _Line]]
_NO_LINES: dict[tuple[object, ...], _Line] = {}  # never written to


class _Block:
    """A block's lines as the last render left them: its version, each family's lines in order, each series' line.
    The text is kept once, as the lines themselves: the render's sections hold the same lists (never changed after
    the render that wrote them), and only the encoder joins them, into the body."""

    __slots__ = ("lines", "runs", "version")

    def __init__(self, version: object, runs: dict[Family, list[str]], lines: _Lines) -> None:
        self.version, self.runs, self.lines = version, runs, lines


class _BlockRows:
    """Rows of one block being written (into ``block``, the block this render keeps); reuses the prefix (and the
    whole line, for an unchanged value) of the block's last render. ``add`` is the hot path of a render: kept flat
    on purpose, with ``go_float``'s common case inlined (a 64-card render formats some 20,000 values)."""

    __slots__ = ("_family", "_old", "block")

    def __init__(self, version: object, old: _Lines) -> None:
        self.block = _Block(version, {}, {})
        self._old = old
        self._family: dict[Family, tuple[dict[tuple[object, ...], _Line], dict[tuple[object, ...], _Line], list[str]]]
        self._family = {}

    def add(self, family: Family, values: tuple[str, ...], value: float) -> None:
        state = self._family.get(family) or self._start(family)
        line = state[0].get(values)
        if line is None:
            prefix = _prefix(family, family.labels, values)
            line = (f"{prefix}{go_float(value)}\n", value, len(prefix))
        elif value != line[1] or (value == 0 and copysign(1.0, value) != copysign(1.0, line[1])):
            text = repr(number := float(value))
            dot = text.find(".")
            if dot < 0:  # inf, nan, exponent forms: go_float's other cases
                text = go_float(number)
            elif number > 0 and dot > 6:  # byte and energy counters: every changed one, so the repr is reused
                text = go_exponent(text, dot)
            line = (f"{line[0][: line[2]]}{text}\n", value, line[2])
        state[1][values] = line
        state[2].append(line[0])

    def add_named(self, family: Family, names: tuple[str, ...], values: tuple[str, ...], value: float) -> None:
        # the same as add, keyed by (names, values): kept apart from add so neither pays a second call
        key = (names, values)
        state = self._family.get(family) or self._start(family)
        line = state[0].get(key)
        if line is None:
            prefix = _prefix(family, names, values)
            line = (f"{prefix}{go_float(value)}\n", value, len(prefix))
        elif value != line[1] or (value == 0 and copysign(1.0, value) != copysign(1.0, line[1])):
            text = repr(number := float(value))
            dot = text.find(".")
            if dot < 0:  # inf, nan, exponent forms: go_float's other cases
                text = go_float(number)
            elif number > 0 and dot > 6:  # byte and energy counters: every changed one, so the repr is reused
                text = go_exponent(text, dot)
            line = (f"{line[0][: line[2]]}{text}\n", value, line[2])
        state[1][key] = line
        state[2].append(line[0])

    def _start(
        self, family: Family
    ) -> tuple[dict[tuple[object, ...], _Line], dict[tuple[object, ...], _Line], list[str]]:
        state = self._family[family] = (self._old.get(family, _NO_LINES), {}, [])
        self.block.lines[family], self.block.runs[family] = state[1], state[2]
        return state


def _prefix(family: Family, names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if len(names) != len(values):
        raise ValueError(f"{family.name}: {len(values)} label values for {len(names)} names")
    return series_prefix(family.sample, zip(names, values, strict=True))


def _nothing() -> None:
    pass


class _Writes:
    """The Exposer of one collector's render: its families in order and its blocks, kept or written now (a written
    block is filled in place by its rows, so the blocks of this render are ready as they are asked for)."""

    def __init__(self, kept: dict[Hashable, _Block], checkpoint: Callable[[], None] = _nothing) -> None:
        self._kept = kept
        self._checkpoint = checkpoint
        self._order: dict[Family, None] = {}
        self._blocks: dict[Hashable, _Block] = {}

    def declare(self, *families: Family) -> None:
        for family in families:
            if family in self._order:
                raise ValueError(f"family {family.name} declared twice")
            self._order[family] = None

    def block(self, key: Hashable, version: object) -> Rows | None:
        self._checkpoint()
        blocks = self._blocks
        count = len(blocks)
        kept = self._kept.get(key)
        if kept is not None and (kept.version is version or kept.version == version):
            blocks[key] = kept
            rows = None
        else:
            rows = _BlockRows(version, kept.lines if kept is not None else {})
            blocks[key] = rows.block
        if len(blocks) == count:  # the render fails: what it wrote is not kept
            raise ValueError(f"block {key!r} written twice in one render")
        return rows

    def finish(self) -> tuple[list[Section], dict[Hashable, _Block]]:
        runs: dict[Family, list[list[str]]] = {family: [] for family in self._order}
        for block in self._blocks.values():
            for family, lines in block.runs.items():
                if (run := runs.get(family)) is None:
                    raise ValueError(f"family {family.name} written but not declared")
                run.append(lines)
        sections = [Section(f.text_header, f.om_header, tuple(runs[f]), frozenset((f.sample,))) for f in self._order]
        return sections, self._blocks


class _Stage:
    """One collector and what it keeps between renders."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.writer = collector if isinstance(collector, SeriesCollector) else None
        self.blocks: dict[Hashable, _Block] = {}
        self.metric_lines = MetricLines()

    def render(self, snapshot: Snapshot, now: float, checkpoint: Callable[[], None]) -> list[Section]:
        if self.writer is None:  # prometheus_client families, materialised first: a failure leaves nothing half-made
            return self.metric_lines.sections(list(self.collector.collect(snapshot, now)))
        writes = _Writes(self.blocks, checkpoint)
        self.writer.write(snapshot, now, writes)
        sections, self.blocks = writes.finish()  # only a render that completed replaces the kept blocks
        return sections


class SnapshotRenderer:
    """Renders the collectors over the Snapshot it is handed. Renders run one at a time (a lock)."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._stages = [_Stage(c) for c in collectors]
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._timing_blocks: dict[Hashable, _Block] = {}

    @property
    def collectors(self) -> tuple[Collector, ...]:
        return tuple(stage.collector for stage in self._stages)

    def render(self, snapshot: Snapshot | None, checkpoint: Callable[[], None] = _nothing) -> Rendered:
        """``checkpoint``: called before each collector and each block (see the module docstring)."""
        with self._lock:
            now = self._clock()
            sections: list[Section] = []
            timings: list[tuple[str, float, float]] = []
            for stage in self._stages:
                checkpoint()
                started = self._monotonic()
                ok = 0.0
                if snapshot is not None:
                    try:
                        sections += stage.render(snapshot, now, checkpoint)
                    except NoDataError:
                        pass
                    except Exception:
                        log.exception("collector failed", collector=stage.collector.name)
                    else:
                        ok = 1.0
                timings.append((stage.collector.name, ok, self._monotonic() - started))
            sections += self._timings(timings)
        return Rendered(sections, lambda: self.families(snapshot, now))

    def families(self, snapshot: Snapshot | None, now: float) -> list[Metric]:
        """The render of ``snapshot`` at ``now`` as prometheus_client families (every collector runs again)."""
        exporter = SnapshotExporter(lambda: snapshot, self.collectors, clock=lambda: now, monotonic=self._monotonic)
        return list(exporter.collect())

    def _timings(self, timings: list[tuple[str, float, float]]) -> list[Section]:
        writes = _Writes(self._timing_blocks)
        writes.declare(SUCCESS, DURATION)
        rows = writes.block("timings", object())  # a version equal to no other: written every render
        assert rows is not None
        for name, ok, seconds in timings:
            rows.add(SUCCESS, (name,), ok)
            rows.add(DURATION, (name,), seconds)
        sections, self._timing_blocks = writes.finish()
        return sections
