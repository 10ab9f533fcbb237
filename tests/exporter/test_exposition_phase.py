"""A publish render takes time: scrapers whose request lands while the render of a Snapshot runs.

Prometheus and the sampler run on fixed rhythms, so a scraper whose request comes a few ms after a Snapshot does
so at every scrape. On a fake clock, each render here moves the clock on by its duration, and the requests due
before it ends are made during it (as the HTTP server's threads would make them): they are served the render
before. The cache must still learn such a scraper's rhythm, render one Snapshot per request for it, and never
make a request wait for (or do) a render; a render slower than the recent ones, a request a little late or made
twice must not unlearn it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from exporter.encoding import Rendered
from exporter.exposition import LEAD_MARGIN, ExpositionCache, RegistryRenderer
from exporter.snapshot import Snapshot
from tests.support.clock import FakeClock

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
INTERVAL = 5.0  # seconds between Snapshots
PERIOD = 15.0  # seconds between one scraper's requests
MAX_AGE = 10.0


class SnapshotTime:
    """A registry collector whose one sample is the (fake) time of the latest Snapshot."""

    def __init__(self) -> None:
        self.taken_at = 0.0

    def collect(self) -> Iterable[Metric]:
        counter = CounterMetricFamily("xpu_test_snapshot", "Time of the Snapshot rendered.")
        counter.add_metric([], self.taken_at)
        return [counter]

    def describe(self) -> Iterable[Metric]:
        return ()


class Node:
    """Snapshots every INTERVAL s and each scraper (host: phase) every PERIOD s, on a fake clock; a render takes
    ``render_seconds`` of it, and a publish render makes the requests due before it ends, at their time."""

    def __init__(self, render_seconds: float, scrapers: dict[str, float]) -> None:
        self.clock = FakeClock(0.0)
        self.render_seconds = render_seconds
        self.source = SnapshotTime()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.source)
        self._inner = RegistryRenderer(registry)
        self.cache = ExpositionCache(self, max_age=MAX_AGE, interval=INTERVAL, monotonic=self.clock)
        self._scheduled = dict(scrapers)  # host -> time of its next request on its rhythm
        self._due = dict(scrapers)  # host -> time it comes
        self._twice: set[str] = set()
        self._publishing = False
        self._next_snapshot = 0.0
        self.reads: list[tuple[str, float, float]] = []  # (host, request time, time of the Snapshot it read)
        self.rendered: list[float] = []  # the Snapshots rendered at publish

    def render(self, snapshot: Snapshot | None, checkpoint: Callable[[], None] = lambda: None) -> Rendered:
        end = self.clock.now + self.render_seconds
        if self._publishing:  # the server answers the requests that come while this renders
            for host, due in sorted(self._due.items(), key=lambda item: item[1]):
                if due < end:
                    checkpoint()
                    self._scrape(host)
        self.clock.now = max(self.clock.now, end)
        return self._inner.render(snapshot, checkpoint)

    def run(self, until: float) -> None:
        while True:
            host, due = min(self._due.items(), key=lambda item: item[1])
            snapshot = self._next_snapshot
            if min(due, snapshot) >= until:
                return
            if snapshot <= due:
                self.clock.now = max(self.clock.now, snapshot)
                self.source.taken_at, renders = snapshot, self.cache.renders["publish"]
                self._publishing = True
                self.cache.publish()
                self._publishing = False
                self.rendered += [snapshot] if self.cache.renders["publish"] > renders else []
                self._next_snapshot += INTERVAL
            else:
                self._scrape(host)

    def delay(self, host: str, seconds: float) -> None:
        """The next request of ``host`` comes this late; the one after is on its rhythm again."""
        self._due[host] = self._scheduled[host] + seconds

    def twice(self, host: str) -> None:
        """The next request of ``host`` is made again 10 ms on (a retry)."""
        self._twice.add(host)

    def _scrape(self, host: str) -> None:
        at = self.clock.now = max(self.clock.now, self._due[host])
        for _ in range(2 if host in self._twice else 1):
            body = gzip.decompress(self.cache.payload(OPENMETRICS, "gzip", client=host).body)
            sample = next(line for line in body.split(b"\n") if line.startswith(b"xpu_test_snapshot_total "))
            self.reads.append((host, at, float(sample.split()[-1])))
            self.clock.now += 0.01
        self._twice.discard(host)
        self._scheduled[host] += PERIOD
        self._due[host] = self._scheduled[host]


def test_a_scraper_whose_requests_land_during_the_render_is_learned_and_costs_one_render_per_request() -> None:
    node = Node(render_seconds=0.2, scrapers={"prometheus": 0.05})  # 50 ms after each Snapshot: mid-render
    node.run(until=60.0)  # its rhythm learned
    before, reads = dict(node.cache.renders), len(node.reads)
    node.run(until=240.0)
    scrapes = len(node.reads) - reads
    assert scrapes == 12
    assert node.cache.renders["publish"] - before["publish"] == scrapes, "one render per request, not per Snapshot"
    assert node.cache.renders["request"] == before["request"], "no request rendered"
    for _, at, taken_at in node.reads[reads:]:
        assert at - taken_at <= INTERVAL + 0.05 + 1e-9, "each read the Snapshot before the one its render is busy with"


def test_a_render_slower_than_usual_does_not_make_a_learned_scraper_unforeseen() -> None:
    node = Node(render_seconds=0.2, scrapers={"prometheus": 0.27})  # read 70 ms after the render is ready
    node.run(until=119.0)
    before, reads = dict(node.cache.renders), len(node.reads)
    node.render_seconds = 0.35  # the render for the request at 120.27 is still under way when it comes
    node.run(until=121.0)
    assert node.reads[-1] == ("prometheus", 120.27, 105.0), "served the render before, at once"
    node.render_seconds = 0.2
    node.run(until=240.0)
    scrapes = len(node.reads) - reads
    assert scrapes == 8
    assert node.cache.renders["publish"] - before["publish"] <= scrapes + 1, (
        "still learned (one Snapshot rendered twice)"
    )


def test_a_render_a_fifth_slower_than_the_recent_ones_still_serves_its_scraper_the_snapshot_before() -> None:
    node = Node(render_seconds=0.2, scrapers={"prometheus": 0.23})  # 30 ms after the renders are ready
    node.run(until=119.0)
    node.render_seconds = 0.24
    node.run(until=121.0)
    assert node.reads[-1][1:] == (120.23, 115.0), "not the render before the one it came during, 15 s old"


def test_a_render_that_took_longer_does_not_make_another_scrapers_request_unforeseen() -> None:
    node = Node(render_seconds=0.2, scrapers={"a": 0.27, "b": 10.5})
    node.run(until=114.0)
    before, reads = dict(node.cache.renders), len(node.reads)
    node.render_seconds = 0.35  # b's render at 115: the next ones are expected later, a's at 120.27 among them
    node.run(until=116.0)
    node.render_seconds = 0.2
    node.run(until=240.0)
    assert node.reads[reads + 1] == ("a", 120.27, 120.0), "rendered for at 120 all the same"
    assert node.cache.renders["request"] == before["request"], "no request rendered"
    read = {taken_at for _, _, taken_at in node.reads}
    assert [t for t in node.rendered if t > 114 and t not in read] == [], "no Snapshot rendered for no one"


def test_a_request_a_little_late_is_not_rendered_for_twice() -> None:
    node = Node(render_seconds=0.2, scrapers={"prometheus": 4.99})  # 10 ms before a Snapshot
    node.run(until=110.0)
    before, reads = dict(node.cache.renders), len(node.reads)
    node.delay("prometheus", 0.03)  # 124.99 comes at 125.02
    node.run(until=240.0)
    assert node.cache.renders["publish"] - before["publish"] == len(node.reads) - reads, node.rendered


def test_a_retried_request_does_not_unlearn_its_scraper() -> None:
    node = Node(render_seconds=0.2, scrapers={"prometheus": 1.0})
    node.run(until=110.0)
    before, reads = dict(node.cache.renders), len(node.reads)
    node.twice("prometheus")
    node.run(until=240.0)
    assert len(node.reads) - reads == 9  # 8 requests, one made twice
    assert node.cache.renders["publish"] - before["publish"] == 8, node.rendered


@settings(max_examples=60, deadline=None)
@given(
    phases=st.lists(st.floats(0.0, INTERVAL, exclude_max=True), min_size=1, max_size=2),
    render_seconds=st.one_of(st.just(0.0), st.floats(0.001, 0.5)),  # (a few ulps of the clock: not a render)
)
def test_once_settled_each_scraper_costs_at_most_one_render_per_period(
    phases: list[float], render_seconds: float
) -> None:
    scrapers = {f"prometheus-{i}": phase + 7.0 * i for i, phase in enumerate(phases)}
    node = Node(render_seconds, scrapers)
    node.run(until=90.0)
    before, reads, rendered = dict(node.cache.renders), len(node.reads), len(node.rendered)
    node.run(until=300.0)
    periods = 210.0 / PERIOD
    assert len(node.rendered) - rendered <= len(scrapers) * periods, node.rendered[rendered:]
    assert node.cache.renders["request"] == before["request"], "no request rendered, nor waited for a render"
    for host, at, taken_at in node.reads[reads:]:
        assert at - taken_at <= MAX_AGE + PERIOD, (host, at, taken_at)
        assert at - taken_at <= INTERVAL + LEAD_MARGIN * render_seconds + 1e-9, (host, at, taken_at)
