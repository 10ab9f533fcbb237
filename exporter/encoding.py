"""Text (0.0.4) and OpenMetrics (1.0.0) encoders that write the same bytes as prometheus_client's, several times faster.

/metrics is rendered once per sampling cycle (exporter/exposition.py). prometheus_client's encoders sort, escape
and format every label of every sample again on each render: on the busy 8-GPU node (400 processes, 100 pods) that
was 43 ms (text) and 72 ms (OpenMetrics) of CPU per cycle, more than the whole daemon's 1 %-of-a-core budget at the
default 5 s interval. Between cycles nearly every series keeps its labels and most keep their value too, so this
encoder keeps each series' rendered line from the previous render and formats only what changed.

The output is byte-for-byte prometheus_client's (tests compare the two on the daemon's own registry and on awkward
label values). What it does not handle itself (exemplars, native histograms, names outside the legacy character set,
samples the text format moves to a family of their own such as ``_created``) makes it hand the whole body to
prometheus_client's encoder instead.

The helpers below it (``headers``, ``series_prefix``, ``Section``, ``encode_sections``) are what the block-cached
path writes with (exporter/collectors/render.py): a series line is the same in both formats, only the HELP/TYPE
headers differ, so one set of lines serves text and OpenMetrics alike. A section holds its lines in runs (a
block's, a family's) and is joined only into a body, so a render's text is not kept a second time as one string.
``MetricLines`` turns the families of
collectors that still build prometheus_client objects into sections, keeping their lines between renders.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

import structlog
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.utils import floatToGoString

log = structlog.get_logger("encoding")

LEGACY_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LEGACY_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TEXT_TYPES = {"counter": "counter", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
TEXT_NAME_SUFFIXES = {"counter": "_total", "info": "_info"}  # the text format's family name for these types
TEXT_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")  # the text encoder puts these in a gauge family of their own
OPENMETRICS_EOF = "# EOF\n"


class Collectable(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class _Unhandled(Exception):  # noqa: N818 - control flow: "let prometheus_client encode this body"
    pass


# A series' line kept between renders: (prefix 'name{labels} ', value, the whole line for that value). A plain
# tuple of strings and a float, which the garbage collector stops tracking (a NamedTuple it tracks for ever).
_Line = tuple[str, float, str]


class Replay:
    """One collect()'s metric families, replayed as often as needed."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = tuple(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def go_float(value: float) -> str:
    """A sample value as prometheus_client (and Go) print it: 1.0, 1.23e+12, NaN, +Inf: prometheus_client's
    ``floatToGoString`` with its common cases inlined (a render formats thousands of values)."""
    d = float(value)
    s = repr(d)
    dot = s.find(".")
    if dot < 0:  # inf, nan and exponent forms
        return str(floatToGoString(d))  # type: ignore[no-untyped-call]
    if d > 0 and dot > 6:  # Go switches to an exponent sooner than Python (prometheus_client's own rule)
        return go_exponent(s, dot)
    return s


def go_exponent(text: str, dot: int) -> str:
    """A positive value of 10**6 or more, given as its ``repr`` and the place of the dot in it, as Go prints it
    (1.23e+12): go_float's exponent case, for a caller that has the repr already."""
    mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
    return f"{mantissa}e+{dot - 1:02d}"


def same_value(a: float, b: float) -> bool:
    """Whether a and b print the same (0.0 and -0.0 are equal but do not)."""
    return a == b and (a != 0 or math.copysign(1, a) == math.copysign(1, b))


def escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def legacy_names(name: str, labels: Iterable[str]) -> bool:
    """Whether a sample's name and label names are in the legacy character set (the only ones written here)."""
    return bool(LEGACY_METRIC_NAME.fullmatch(name)) and all(LEGACY_LABEL_NAME.fullmatch(k) for k in labels)


def headers(name: str, kind: str, documentation: str, unit: str) -> tuple[str, str]:
    """A family's HELP/TYPE (and OpenMetrics UNIT) lines: (text 0.0.4, OpenMetrics 1.0.0). ValueError for a name
    outside the legacy character set (prometheus_client escapes those; this module does not)."""
    if not LEGACY_METRIC_NAME.fullmatch(name):
        raise ValueError(f"metric name {name!r} is outside the legacy character set")
    unit_line = f"# UNIT {name} {unit}\n" if unit else ""
    om = f"# HELP {name} {escape_value(documentation)}\n# TYPE {name} {kind}\n{unit_line}"
    text_name = name + TEXT_NAME_SUFFIXES.get(kind, "")
    text_kind = TEXT_TYPES.get(kind, "untyped" if kind == "unknown" else kind)
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {text_name} {doc}\n# TYPE {text_name} {text_kind}\n", om


def series_prefix(sample: str, labels: Iterable[tuple[str, str]]) -> str:
    """``name{a="1",b="2"} `` (labels sorted by name, values escaped), the part of a line before its value."""
    pairs = ",".join(f'{k}="{escape_value(v)}"' for k, v in sorted(labels))
    return f"{sample}{{{pairs}}} " if pairs else f"{sample} "


class Section(NamedTuple):
    """One family of a render: its headers and its series lines (the same in both formats), or, for a family only
    prometheus_client's encoders write (exemplars, ``_created``, UTF-8 names...), the family itself."""

    text_header: str
    om_header: str
    runs: tuple[Sequence[str], ...]  # its series lines, one string a line, in runs (a block's, a family's)
    samples: frozenset[str]  # the sample names on its lines (``name[]`` selections)
    metric: Metric | None = None


def metric_section(metric: Metric) -> Section:
    """A family encoded by prometheus_client itself, as it would be inside a whole body."""
    return Section("", "", (), frozenset(s.name for s in metric.samples), metric)


def _delegated(metric: Metric, openmetrics: bool) -> str:
    if openmetrics:
        body: bytes = openmetrics_latest(Replay([metric]))  # type: ignore[no-untyped-call]
        return body.decode()[: -len(OPENMETRICS_EOF)]
    return text_latest(Replay([metric])).decode()


def encode_sections(sections: Iterable[Section], *, openmetrics: bool) -> bytes:
    """The whole body of one format: what prometheus_client's generate_latest would write for these families."""
    out: list[str] = []
    for section in sections:
        if section.metric is not None:
            out.append(_delegated(section.metric, openmetrics))
        else:
            out.append(section.om_header if openmetrics else section.text_header)
            for run in section.runs:
                out += run
    if openmetrics:
        out.append(OPENMETRICS_EOF)
    return "".join(out).encode("utf-8")


def select_sections(sections: Iterable[Section], names: set[str]) -> list[Section]:
    """Only the series whose sample name is in ``names`` (``name[]``); families left without one are dropped."""
    kept: list[Section] = []
    for section in sections:
        if not section.samples & names:
            continue
        if section.metric is not None:
            m = section.metric
            restricted = Metric(m.name, m.documentation, m.type, m.unit)
            restricted.samples = [s for s in m.samples if s.name in names]
            kept.append(metric_section(restricted))
        elif section.samples <= names:
            kept.append(section)
        else:
            lines = [line for run in section.runs for line in run if _line_name(line) in names]
            kept.append(section._replace(runs=(lines,), samples=section.samples & names))
    return kept


def _line_name(line: str) -> str:
    end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
    return line[:end]


class Rendered:
    """One render: its sections, and the same render as prometheus_client families (made only when asked, for the
    formats exporter/encoding.py does not write)."""

    def __init__(self, sections: Sequence[Section], families: Callable[[], Sequence[Metric]]) -> None:
        self.sections = tuple(sections)
        self._families = families
        self._made: Sequence[Metric] | None = None
        self._lock = threading.Lock()

    def families(self) -> Sequence[Metric]:
        with self._lock:
            if self._made is None:
                self._made = tuple(self._families())
            return self._made


class MetricLines:
    """prometheus_client families -> sections, keeping each series' line from the previous call (not thread-safe:
    one owner renders at a time). Families it does not write itself become delegated sections."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Line] = {}
        self._headers: dict[tuple[str, str, str, str], tuple[str, str]] = {}

    def sections(self, families: Iterable[Metric]) -> list[Section]:
        old_lines, old_headers = self._lines, self._headers
        lines: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Line] = {}
        heads: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        out: list[Section] = []
        for metric in families:
            try:
                out.append(self._section(metric, old_lines, lines, old_headers, heads))
            except _Unhandled:
                out.append(metric_section(metric))
        self._lines, self._headers = lines, heads
        return out

    @staticmethod
    def _section(
        metric: Metric,
        old_lines: Mapping[tuple[str, str, tuple[tuple[str, str], ...]], _Line],
        lines: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Line],
        old_headers: Mapping[tuple[str, str, str, str], tuple[str, str]],
        heads: dict[tuple[str, str, str, str], tuple[str, str]],
    ) -> Section:
        hkey = (metric.name, metric.type, metric.documentation, metric.unit)
        head = old_headers.get(hkey)
        if head is None:
            if not LEGACY_METRIC_NAME.fullmatch(metric.name):
                raise _Unhandled
            head = headers(*hkey)
        heads[hkey] = head
        moved = {metric.name + suffix for suffix in TEXT_MOVED_SUFFIXES}
        text: list[str] = []
        names: set[str] = set()
        for s in metric.samples:
            if s.exemplar is not None or getattr(s, "native_histogram", None) is not None or s.value is None:
                raise _Unhandled
            if s.timestamp is not None or s.name in moved:  # written differently by the two formats
                raise _Unhandled
            key = (metric.name, s.name, tuple(s.labels.items()))
            line = old_lines.get(key)
            if line is None:
                if not legacy_names(s.name, s.labels):
                    raise _Unhandled
                line = (series_prefix(s.name, s.labels.items()), math.nan, "")
            if not same_value(s.value, line[1]):
                line = (line[0], s.value, f"{line[0]}{go_float(s.value)}\n")
            lines[key] = line
            text.append(line[2])
            names.add(s.name)
        return Section(head[0], head[1], (text,), frozenset(names))


class CachingEncoder:
    """One exposition format over a registry: its families through ``MetricLines`` (lines kept between calls),
    then ``encode_sections``. Thread-safe; renders run one at a time. ``fallback`` is prometheus_client's encoder of
    the same format, used for the whole body should this one fail."""

    def __init__(self, *, openmetrics: bool, fallback: Callable[[Collectable], bytes]) -> None:
        self._openmetrics = openmetrics
        self._fallback = fallback
        self._lock = threading.Lock()
        self._lines = MetricLines()

    def __call__(self, source: Collectable) -> bytes:
        families = list(source.collect())
        with self._lock:
            try:
                return self._encode(families)
            except Exception:  # a bug here must not cost the scrape: prometheus_client's encoder still can
                log.exception("caching encoder failed; encoding with prometheus_client's")
                self._lines = MetricLines()
        return self._fallback(Replay(families))

    def _encode(self, families: list[Metric]) -> bytes:
        return encode_sections(self._lines.sections(families), openmetrics=self._openmetrics)
