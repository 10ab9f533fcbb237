"""Generated families, rendered by the block-cached path, are byte for byte what prometheus_client's own text 0.0.4
and OpenMetrics 1.0.0 encoders write for the same families: label values with quotes, backslashes, newlines and
any Unicode, NaN, infinities, -0.0 and large values, gauges, counters and info series written as series, and
histograms, summaries, statesets and the rest through prometheus_client families. Several renders in a row, with
blocks kept, rewritten, added and dropped between them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.utils import floatToGoString

from exporter.collectors import Collector
from exporter.collectors.render import SnapshotRenderer
from exporter.collectors.series import COUNTER, GAUGE, INFO, Exposer, Family, SeriesCollector
from exporter.encoding import go_float
from exporter.snapshot import Snapshot
from tests.exporter.collectors.test_render import fast, reference

LABEL_NAMES = ("a", "b", "le_x", "z9", "_u")
text_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ['say "hi"', "back\\slash", "two\nlines", "trailing\\", "", "Grüße, 東京 ✓"]
)
values = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 1e22, 123456789.0, 1234567.0, 1e-9, 5e-324, 2.0**53]
)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-(2**70), max_value=2**70))
def test_values_print_as_prometheus_client_prints_them(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


Row = tuple[int, tuple[str, ...] | None, tuple[str, ...], float]  # family, own label names (or None), values, value


@st.composite
def families(draw: st.DrawFn) -> list[Family]:
    count = draw(st.integers(min_value=1, max_value=4))
    out = []
    for i in range(count):
        kind = draw(st.sampled_from((GAUGE, COUNTER, INFO)))
        labels = tuple(draw(st.lists(st.sampled_from(LABEL_NAMES), unique=True, max_size=3)))
        help_text = draw(text_values)
        out.append(Family(f"xpu_gen_{i}_{kind[0]}", help_text, kind, labels))
    return out


@st.composite
def frames(draw: st.DrawFn, fams: Sequence[Family]) -> list[dict[str, list[Row]]]:
    """Renders in a row: each a set of blocks (key -> rows); a block may stay as it was, change or go."""
    out: list[dict[str, list[Row]]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        frame: dict[str, list[Row]] = {}
        for key in draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=4)):
            if out and key in out[-1] and draw(st.booleans()):
                frame[key] = out[-1][key]  # unchanged: kept from the last render
                continue
            rows: list[Row] = []
            for _ in range(draw(st.integers(min_value=0, max_value=4))):
                index = draw(st.integers(min_value=0, max_value=len(fams) - 1))
                names: tuple[str, ...] | None = None
                if draw(st.booleans()):
                    names = tuple(draw(st.lists(st.sampled_from(LABEL_NAMES), unique=True, max_size=3)))
                count = len(fams[index].labels if names is None else names)
                label_values = tuple(draw(st.lists(text_values, min_size=count, max_size=count)))
                rows.append((index, names, label_values, draw(values)))
            frame[key] = rows
        out.append(frame)
    return out


class Generated(SeriesCollector):
    name = "generated"

    def __init__(self, fams: Sequence[Family]) -> None:
        self.families = fams
        self.frame: dict[str, list[Row]] = {}

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(*self.families)
        for key, rows in self.frame.items():
            block = out.block(key, repr(rows))  # repr: -0.0 and 0.0 are versions apart, as they print apart
            if block is None:
                continue
            for index, names, label_values, value in rows:
                family = self.families[index]
                if names is None:
                    block.add(family, label_values, value)
                else:
                    block.add_named(family, names, label_values, value)


def _constant() -> float:
    return 0.0


@settings(max_examples=150)
@given(st.data())
def test_series_written_in_blocks_encode_as_prometheus_client_encodes_them(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    fams = data.draw(families())
    collector = Generated(fams)
    renderer = SnapshotRenderer([collector], clock=lambda: 1.0, monotonic=_constant)
    for n, frame in enumerate(data.draw(frames(fams))):
        collector.frame = frame
        assert fast(renderer, snapshot) == reference(snapshot, [collector], 1.0), f"render {n}"


@st.composite
def metric(draw: st.DrawFn, index: int) -> Metric:
    """One prometheus_client family of any type, with a few samples."""
    name, doc = f"xpu_any_{index}", draw(text_values)
    kind = draw(st.sampled_from(("gauge", "counter", "info", "histogram", "summary", "stateset", "gh", "unknown")))
    samples = draw(st.lists(st.lists(text_values, min_size=1, max_size=1), max_size=3))
    number = draw(values)
    if kind == "gauge":
        family: Metric = GaugeMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], draw(values))
    elif kind == "counter":
        family = CounterMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            created = draw(st.none() | st.floats(min_value=0, max_value=2e9))
            family.add_metric([label], abs(number) if not math.isnan(number) else 0.0, created=created)
    elif kind == "info":
        family = InfoMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], {"version": draw(text_values)})
    elif kind == "histogram":
        family = HistogramMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], [("0.1", 1.0), ("1.0", 3.0), ("+Inf", 4.0)], sum_value=draw(values))
    elif kind == "gh":
        family = GaugeHistogramMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], [("1.0", 2.0), ("+Inf", 3.0)], gsum_value=draw(values))
    elif kind == "summary":
        family = SummaryMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], count_value=3, sum_value=draw(values))
    elif kind == "stateset":
        family = StateSetMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], {"ok": draw(st.booleans()), "bad": draw(st.booleans())})
    else:
        family = UnknownMetricFamily(name, doc, labels=["a"])
        for (label,) in samples:
            family.add_metric([label], number)
    return family


class Families:
    """A collector of prometheus_client families (the compatibility path), set by the test before each render."""

    name = "families"

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self, snapshot: Snapshot, now: float) -> list[Metric]:
        return list(self.families)


@settings(max_examples=150)
@given(st.data())
def test_prometheus_client_families_encode_as_prometheus_client_encodes_them(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    collector = Families()
    collectors: list[Collector] = [collector]
    renderer = SnapshotRenderer(collectors, clock=lambda: 1.0, monotonic=_constant)
    for n in range(data.draw(st.integers(min_value=1, max_value=3))):
        count = data.draw(st.integers(min_value=0, max_value=4))
        collector.families = [data.draw(metric(i)) for i in range(count)]
        assert fast(renderer, snapshot) == reference(snapshot, collectors, 1.0), f"render {n}"
