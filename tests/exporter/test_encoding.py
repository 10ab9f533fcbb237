"""exporter/encoding.py writes exactly prometheus_client's bytes, in both formats, render after render: on the daemon's
own collectors as values move, on awkward label values and help texts, and on every metric type prometheus_client
has (what it does not handle itself it hands to prometheus_client)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest
from prometheus_client import Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.encoding import CachingEncoder, MetricLines, Replay, encode_sections, select_sections
from exporter.sampler import Sampler, SamplerSettings
from tests.support.clock import FakeClock


def encoders() -> list[tuple[CachingEncoder, object]]:
    return [
        (CachingEncoder(openmetrics=False, fallback=text_latest), text_latest),
        (CachingEncoder(openmetrics=True, fallback=om_latest), om_latest),
    ]


class Families:
    """A collector whose families the test sets before each render."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterable[Metric]:
        return list(self.families)


def test_the_daemons_collectors_render_identically_cycle_after_cycle(clock: FakeClock) -> None:
    sim = SimulatedBackend.from_name("h200x8", clock=clock)
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5, call_deadline_seconds=5), clock=clock)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler.latest, default_collectors(), clock=clock))
    pairs = encoders()
    try:
        for cycle in range(6):
            clock.advance(5)
            if cycle == 3:  # series come and go: a card stops answering, a process starts
                sim.inject("hang", 2, {"call": "sample"})
                sim.inject("process_start", 5, {"pid": "4242", "name": 'odd "name"\\'})
            if cycle == 5:
                sim.clear()
            sampler.run_once()
            once = Families()  # one collect for both: collector durations differ between collects
            once.families = list(registry.collect())
            for fast, reference in pairs:
                assert fast(once) == reference(once), f"cycle {cycle}"  # type: ignore[operator]
    finally:
        sim.clear()
        sampler.stop()


AWKWARD = ('say "hi"', "back\\slash", "two\nlines", "Grüße, 東京 ✓", "trailing\\", "")


def test_awkward_label_values_help_texts_and_special_values() -> None:
    source = Families()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(source)
    values = [1.0, 0.0, -0.0, math.nan, math.inf, -math.inf, 1e-9, 123456789.0, 1e22, 7]
    pairs = encoders()
    for shift in range(len(values)):
        gauge = GaugeMetricFamily("xpu_test_value", 'Help with "quotes", \\ and a\nnewline.', labels=["what", "b"])
        for i, text in enumerate(AWKWARD):
            gauge.add_metric([text, str(i)], values[(i + shift) % len(values)])
        unlabelled = GaugeMetricFamily("xpu_test_plain", "No labels.", value=values[shift])
        counter = CounterMetricFamily("xpu_test_events", "Events.", labels=["z", "a"], unit="seconds")
        counter.add_metric(["1", "2"], values[shift] if values[shift] >= 0 else 0.0)
        stamped = GaugeMetricFamily("xpu_test_stamped", "With a timestamp.", labels=["k"])
        stamped.add_metric(["v"], 2.0, timestamp=1700000000.123)
        source.families = [gauge, unlabelled, counter, stamped]
        for fast, reference in pairs:
            assert fast(registry) == reference(registry), f"shift {shift}"  # type: ignore[operator]


def test_every_prometheus_client_metric_type() -> None:
    registry = CollectorRegistry(auto_describe=False)
    c = Counter("xpu_test_requests", "Requests.", ["code"], registry=registry)
    g = Gauge("xpu_test_temperature", "Temperature.", registry=registry, unit="celsius")
    h = Histogram("xpu_test_latency_seconds", "Latency.", registry=registry, buckets=(0.1, 1.0))
    s = Summary("xpu_test_size_bytes", "Size.", registry=registry)
    i = Info("xpu_test_build", "Build.", registry=registry)
    e = Enum("xpu_test_state", "State.", states=["ok", "bad"], registry=registry)
    pairs = encoders()
    for step in range(3):
        c.labels(code=str(200 + step)).inc(step + 1)
        g.set(20.5 + step)
        h.observe(0.05 * step)
        s.observe(10 * step)
        i.info({"version": f"1.{step}"})
        e.state("bad" if step % 2 else "ok")
        for fast, reference in pairs:
            assert fast(registry) == reference(registry), f"step {step}"  # type: ignore[operator]


def test_series_that_come_and_go_and_names_it_leaves_to_prometheus_client() -> None:
    source = Families()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(source)
    pairs = encoders()
    for n in (3, 0, 5, 1):
        fam = GaugeMetricFamily("xpu_test_churn", "Churn.", labels=["pid"])
        for pid in range(n):
            fam.add_metric([str(1000 + pid * n)], float(pid))
        utf8 = Metric("xpu.test.dotted", "A name outside the legacy character set.", "gauge")
        utf8.add_sample("xpu.test.dotted", {"label.with.dots": "v"}, float(n))
        source.families = [fam, utf8] if n == 5 else [fam]
        for fast, reference in pairs:
            assert fast(registry) == reference(registry), f"{n} series"  # type: ignore[operator]


@pytest.mark.parametrize("openmetrics", [False, True])
def test_a_render_reuses_the_lines_of_unchanged_series(openmetrics: bool) -> None:
    source = Families()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(source)
    encoder = CachingEncoder(openmetrics=openmetrics, fallback=om_latest if openmetrics else text_latest)
    fam = GaugeMetricFamily("xpu_test_static", "Static.", labels=["i"])
    for n in range(100):
        fam.add_metric([str(n)], 1.0)
    source.families = [fam]
    first = encoder(registry)
    again = GaugeMetricFamily("xpu_test_static", "Static.", labels=["i"])
    for n in range(100):
        again.add_metric([str(n)], 1.0 if n else 2.0)
    source.families = [again]
    second = encoder(registry)
    assert first.replace(b'{i="0"} 1.0', b'{i="0"} 2.0') == second


def test_a_bug_in_the_encoder_costs_no_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    source = Families()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(source)
    source.families = [GaugeMetricFamily("xpu_test_value", "A value.", value=3.0)]
    encoder = CachingEncoder(openmetrics=True, fallback=om_latest)

    def broken(self: CachingEncoder, families: list[Metric]) -> bytes:
        raise KeyError("a bug")

    monkeypatch.setattr(CachingEncoder, "_encode", broken)
    assert encoder(registry) == om_latest(registry)


def test_a_name_selection_keeps_the_asked_lines_of_every_run_of_a_section() -> None:
    """A section's lines come in runs (a block's each); ``name[]`` selects lines out of all of them, in order."""
    histogram = HistogramMetricFamily("xpu_test_wait_seconds", "Waits.", labels=["card"])
    for card in ("0", "1", "2"):
        histogram.add_metric([card], buckets=[("0.5", 1.0), ("+Inf", 2.0)], sum_value=float(card) + 0.25)
    (whole,) = MetricLines().sections([histogram])
    lines = list(whole.runs[0])
    in_runs = whole._replace(runs=(lines[:4], lines[4:7], lines[7:]))  # runs that cut across the cards
    names = {"xpu_test_wait_seconds_sum", "xpu_test_wait_seconds_count"}
    restricted = Metric(histogram.name, histogram.documentation, histogram.type)
    restricted.samples = [s for s in histogram.samples if s.name in names]
    for openmetrics, latest in ((False, text_latest), (True, om_latest)):
        expected = latest(Replay([restricted]))
        assert encode_sections(select_sections([in_runs], names), openmetrics=openmetrics) == expected
        assert encode_sections([in_runs], openmetrics=openmetrics) == latest(Replay([histogram]))
