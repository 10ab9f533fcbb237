"""/metrics rendered once per Snapshot: what scrapes get from the exposition cache, over a real HTTP server.

The registry is the daemon's (SnapshotExporter over the default collectors and the process and pod collectors) on
a simulated node, or a small collector with awkward label values; scrapes go through MetricsHTTPServer.
"""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
import threading
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.collectors.render import SnapshotRenderer
from exporter.encoding import Rendered, go_float
from exporter.exposition import HOT_SECONDS, PROMETHEUS_FORMATS, ExpositionCache, RegistryRenderer, accepts_gzip
from exporter.http import Health, MetricsHTTPServer
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.sim.node import SimulatedNode
from tests.support.clock import FakeClock

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
TEXT = "text/plain;version=0.0.4"
AWKWARD = ('say "hi"', "back\\slash", "two\nlines", "Grüße, 東京 ✓", "trailing\\")


class CountingCollector:
    """A registry collector with awkward label values whose value is set by the test; counts its collect() calls."""

    def __init__(self) -> None:
        self.value = 1.0
        self.calls = 0

    def collect(self) -> Iterable[Metric]:
        self.calls += 1
        gauge = GaugeMetricFamily("xpu_test_value", "A value\nwith a \\ in its help.", labels=["what"])
        for i, text in enumerate(AWKWARD):
            gauge.add_metric([text], self.value + i)
        counter = CounterMetricFamily("xpu_test_events", "Events.", labels=["what"])
        counter.add_metric(["x"], 3 * self.value)
        info = InfoMetricFamily("xpu_test_build", "Build.", labels=["gpu"])
        info.add_metric(["0"], {"version": 'v"1"'})
        return [gauge, counter, info]

    def describe(self) -> Iterable[Metric]:
        return ()


@pytest.fixture
def counting() -> CountingCollector:
    return CountingCollector()


@pytest.fixture
def mono() -> FakeClock:
    return FakeClock(1000.0)


def _registry(collector: CountingCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


@pytest.fixture
def cache(counting: CountingCollector, mono: FakeClock) -> ExpositionCache:
    return ExpositionCache(_registry(counting), max_age=10.0, monotonic=mono)


@pytest.fixture
def server(cache: ExpositionCache) -> Iterator[MetricsHTTPServer]:
    srv = MetricsHTTPServer(("127.0.0.1", 0), cache, health=lambda: Health(True, "ok"))
    srv.start()
    yield srv
    srv.stop()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_scrapes_between_snapshots_get_the_same_bytes_without_collecting(
    server: MetricsHTTPServer, cache: ExpositionCache, counting: CountingCollector
) -> None:
    first = get(server.port, headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})
    calls = counting.calls
    second = get(server.port, headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})
    assert first[0] == second[0] == 200
    assert first[2] == second[2]
    assert counting.calls == calls == 1, "the second scrape served bytes: no collect, no encode"


def test_a_scrape_after_a_new_snapshot_sees_new_values(
    server: MetricsHTTPServer, cache: ExpositionCache, counting: CountingCollector
) -> None:
    before = get(server.port, headers={"Accept": TEXT})[2].decode()
    counting.value = 7.0
    assert get(server.port, headers={"Accept": TEXT})[2].decode() == before, "no Snapshot yet: same render"
    cache.publish()
    after = get(server.port, headers={"Accept": TEXT})[2].decode()
    assert 'xpu_test_value{what="say \\"hi\\""} 7.0' in after
    assert 'xpu_test_value{what="say \\"hi\\""} 1.0' in before


def test_publish_renders_the_formats_scrapers_asked_for_and_nothing_when_no_one_scrapes(
    server: MetricsHTTPServer, cache: ExpositionCache, counting: CountingCollector, mono: FakeClock
) -> None:
    cache.publish()
    assert counting.calls == 0, "no scraper yet: publishing costs nothing"
    get(server.port, headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})
    assert counting.calls == 1, "the first scrape rendered on its own thread"
    counting.value = 2.0
    cache.publish()
    assert counting.calls == 2, "a scraper is there: the Snapshot is rendered when published"
    body = get(server.port, headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})[2]
    assert counting.calls == 2, "and the scrape only served it"
    assert b'xpu_test_events_total{what="x"} 6.0' in gzip.decompress(body)
    mono.now += HOT_SECONDS + 1
    cache.publish()
    assert counting.calls == 2, "the scraper went away: publishing stops rendering"


@pytest.mark.parametrize("phase", [0.3, 2.0, 4.7])
def test_with_an_interval_publish_renders_every_snapshot_until_the_rhythm_is_learned_then_only_the_one_read(
    counting: CountingCollector, mono: FakeClock, phase: float
) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(counting)
    cache = ExpositionCache(registry, max_age=10.0, interval=5.0, monotonic=mono)
    rendered_at_publish, rendered_at_scrape = [], []
    for tick in range(1210):  # Snapshots every 5 s; Prometheus scrapes every 15 s, `phase` s after a Snapshot
        t = tick / 10
        mono.now = 1000.0 + t
        calls = counting.calls
        if tick % 50 == 0:
            counting.value = t
            cache.publish()
            if counting.calls > calls:
                rendered_at_publish.append(t)
        if tick % 150 == round(phase * 10):
            body = gzip.decompress(cache.payload(OPENMETRICS, "gzip").body)
            if counting.calls > calls:
                rendered_at_scrape.append(t)
            latest = 3 * (t - phase)
            assert f'xpu_test_events_total{{what="x"}} {latest:.1f}'.encode() in body, "the latest Snapshot"
    assert rendered_at_scrape == [phase], "only a format never asked for before is rendered on the request"
    learning = [5.0 * n for n in range(1, 10)]  # requests at 15 and 30 teach the period, at 30 and 45 confirm it
    assert rendered_at_publish == [*learning, 60, 75, 90, 105, 120], "then only the Snapshot before each scrape"
    assert cache.renders == {"publish": len(rendered_at_publish), "request": 1}


def test_a_burst_that_ended_or_a_scraper_that_stopped_is_rendered_for_until_it_is_forgotten(
    counting: CountingCollector, mono: FakeClock
) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(counting)
    cache = ExpositionCache(registry, max_age=10.0, interval=5.0, monotonic=mono)
    for _ in range(5):  # a person polling with curl
        mono.now += 0.3
        cache.payload(TEXT)
    renders = []
    for t in range(5, 200, 5):
        calls = counting.calls
        mono.now += 5.0
        cache.publish()
        renders += [t] if counting.calls > calls else []
    assert renders == list(range(5, int(HOT_SECONDS) + 1, 5)), "one render per Snapshot while it may come back, no more"
    renders = []
    for t in range(5, 300, 5):  # a scraper every 15 s for 90 s, learned, then gone
        calls = counting.calls
        mono.now += 5.0
        cache.publish()
        renders += [t] if counting.calls > calls else []
        if t <= 90 and t % 15 == 0:
            mono.now += 0.5
            cache.payload(OPENMETRICS, "gzip")
            mono.now -= 0.5
    learning, learned = list(range(20, 61, 5)), [75, 90]  # first request at 15: rendered on it
    late = list(range(105, 91 + int(HOT_SECONDS), 5))  # expected, late, then overdue (a restart?), forgotten
    assert renders == [*learning, *learned, *late]


def _scrape_for(
    cache: ExpositionCache, counting: CountingCollector, mono: FakeClock, seconds: float, scrapers: dict[str, float]
) -> tuple[list[tuple[float, float]], list[float]]:
    """Snapshots every 5 s, each scraper (host: phase) every 15 s, for ``seconds`` from ``mono``'s time: (request
    time, time of the Snapshot it read) for every request, and the times of the Snapshots rendered at publish."""
    read, rendered = [], []
    start = round((mono.now - 1000.0) * 10)
    for tick in range(start, start + round(seconds * 10)):
        mono.now = 1000.0 + tick / 10
        if tick % 50 == 0:
            counting.value, calls = tick / 10, counting.calls
            cache.publish()
            rendered += [tick / 10] if counting.calls > calls else []
        for host, phase in scrapers.items():
            if tick % 150 == round(phase * 10):
                body = gzip.decompress(cache.payload(OPENMETRICS, "gzip", client=host).body)
                events = next(line for line in body.split(b"\n") if line.startswith(b"xpu_test_events_total{"))
                read.append((tick / 10, float(events.split()[-1]) / 3))
    return read, rendered


def test_a_new_scraper_of_a_learned_format_is_served_without_a_render_on_its_request(
    counting: CountingCollector, mono: FakeClock
) -> None:
    cache = ExpositionCache(_registry(counting), max_age=10.0, interval=5.0, monotonic=mono)
    _scrape_for(cache, counting, mono, 120.0, {"prometheus-a": 0.3})  # learned
    before = dict(cache.renders)
    both = {"prometheus-a": 0.3, "prometheus-b": 12.3}  # its HA replica joins, 12 s later
    read, _ = _scrape_for(cache, counting, mono, 120.0, both)
    assert cache.renders["request"] == before["request"], "no request waited for a render"
    assert read[1] == (132.3, 120.0), "B's first request: the latest body made in its format (A's, 12 s old)"
    assert all(snapshot == t // 5 * 5 for t, snapshot in read[2:]), "then each request reads the latest Snapshot"
    _, rendered = _scrape_for(cache, counting, mono, 60.0, both)
    assert rendered == [240, 250, 255, 265, 270, 280, 285, 295], "each replica's rhythm learned apart"


def test_a_restarted_scraper_is_served_at_once_and_its_new_rhythm_learned(
    counting: CountingCollector, mono: FakeClock
) -> None:
    cache = ExpositionCache(_registry(counting), max_age=10.0, interval=5.0, monotonic=mono)
    _scrape_for(cache, counting, mono, 120.0, {"prometheus": 0.3})
    _scrape_for(cache, counting, mono, 42.0, {})  # it restarts: 27 s past its due request
    before = dict(cache.renders)
    read, rendered = _scrape_for(cache, counting, mono, 100.0, {"prometheus": 3.3})  # back, 168.3 s and on
    assert cache.renders["request"] == before["request"], "no request waited for a render"
    assert all(snapshot == t // 5 * 5 for t, snapshot in read), "every request read the latest Snapshot"
    assert [t for t in rendered if t > 210] == [225, 240, 255], (
        "its new rhythm learned: the Snapshot before each request"
    )


def test_publish_renders_the_expected_formats_before_anyone_asked(counting: CountingCollector, mono: FakeClock) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(counting)
    cache = ExpositionCache(registry, max_age=10.0, interval=5.0, monotonic=mono, expect=PROMETHEUS_FORMATS)
    cache.publish()
    assert counting.calls == 1, "a freshly started daemon renders Prometheus' format for the first scrape"
    mono.now += 0.5
    body = cache.payload(OPENMETRICS, "gzip").body
    assert b"xpu_test_events_total" in gzip.decompress(body)
    assert cache.renders == {"publish": 1, "request": 0}


def test_a_scrape_during_a_render_is_served_the_render_before_at_once() -> None:
    class Slow:
        """A renderer whose second render blocks until the test lets it go."""

        def __init__(self) -> None:
            self.inner = RegistryRenderer(_registry(CountingCollector()))
            self.entered, self.release = threading.Event(), threading.Event()
            self.count = 0

        def render(self, snapshot: Snapshot | None) -> Rendered:
            self.count += 1
            if self.count == 2:
                self.entered.set()
                self.release.wait(10)
            return self.inner.render(snapshot)

    slow = Slow()
    cache = ExpositionCache(slow, max_age=10.0, interval=None)
    before = cache.payload(TEXT).body
    publishing = threading.Thread(target=cache.publish)
    publishing.start()
    try:
        assert slow.entered.wait(10)
        assert cache.payload(TEXT).body == before, "served at once from the last render"
    finally:
        slow.release.set()
        publishing.join(10)


def test_a_stopped_sampler_does_not_freeze_the_values(
    server: MetricsHTTPServer, cache: ExpositionCache, counting: CountingCollector, mono: FakeClock
) -> None:
    get(server.port, headers={"Accept": TEXT})
    counting.value = 50.0
    mono.now += 9.0
    assert b'xpu_test_events_total{what="x"} 3.0' in get(server.port, headers={"Accept": TEXT})[2]
    mono.now += 2.0  # past max_age with no Snapshot: the scrape renders again (sample age keeps growing)
    assert b'xpu_test_events_total{what="x"} 150.0' in get(server.port, headers={"Accept": TEXT})[2]


def test_escaping_is_prometheus_clients_own(server: MetricsHTTPServer, counting: CountingCollector) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CountingCollector())
    text = get(server.port, headers={"Accept": TEXT})[2]
    om = get(server.port, headers={"Accept": OPENMETRICS})[2]
    assert text == generate_latest(registry)
    assert om == generate_openmetrics(registry)
    values = {s.labels["what"] for f in parse_text(text.decode()) for s in f.samples if s.name == "xpu_test_value"}
    assert values == set(AWKWARD)
    om_values = {s.labels["what"] for f in parse_openmetrics(om.decode()) for s in f.samples if "what" in s.labels}
    assert set(AWKWARD) <= om_values


def test_gzip_and_identity_carry_the_same_body(server: MetricsHTTPServer) -> None:
    for accept in (TEXT, OPENMETRICS):
        status, headers, plain = get(server.port, headers={"Accept": accept})
        assert status == 200 and "content-encoding" not in headers
        status, headers, packed = get(server.port, headers={"Accept": accept, "Accept-Encoding": "gzip, deflate"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert int(headers["content-length"]) == len(packed)
        assert gzip.decompress(packed) == plain
    _, headers, body = get(server.port, headers={"Accept": TEXT, "Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in headers and body.startswith(b"# HELP")


def test_content_types_follow_the_accept_header(server: MetricsHTTPServer) -> None:
    assert get(server.port, headers={"Accept": OPENMETRICS})[1]["content-type"].startswith(
        "application/openmetrics-text; version=1.0.0"
    )
    assert get(server.port, headers={"Accept": TEXT})[1]["content-type"].startswith("text/plain; version=0.0.4")
    assert get(server.port)[1]["content-type"].startswith("text/plain; version=0.0.4")
    assert get(server.port, headers={"Accept": OPENMETRICS})[2].endswith(b"# EOF\n")


def test_name_selection_returns_only_those_series(server: MetricsHTTPServer) -> None:
    path = "/metrics?name[]=xpu_test_events_total&name[]=xpu_test_build_info"
    for headers in ({"Accept": TEXT}, {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}):
        status, got, body = get(server.port, path, headers)
        text = gzip.decompress(body) if got.get("content-encoding") == "gzip" else body
        names = {s.name for f in parse_text(text.decode().replace("# EOF\n", "")) for s in f.samples}
        assert status == 200
        assert names == {"xpu_test_events_total", "xpu_test_build_info"}
    _, _, none = get(server.port, "/metrics?name[]=xpu_no_such_metric", {"Accept": TEXT})
    assert none == b""


def test_concurrent_scrapes_while_publishing_get_whole_bodies(
    server: MetricsHTTPServer, cache: ExpositionCache, counting: CountingCollector
) -> None:
    get(server.port, headers={"Accept": TEXT, "Accept-Encoding": "gzip"})
    errors: list[str] = []
    stop = threading.Event()

    def scrape() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        while not stop.is_set():
            conn.request("GET", "/metrics", headers={"Accept": TEXT, "Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            body = gzip.decompress(resp.read()).decode()
            values = {s.value for f in parse_text(body) for s in f.samples if s.name == "xpu_test_events_total"}
            if resp.status != 200 or len(values) != 1:
                errors.append(f"{resp.status}: {values}")
        conn.close()

    threads = [threading.Thread(target=scrape) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(30):
        counting.value = float(i)
        cache.publish()
    stop.set()
    for t in threads:
        t.join(10)
    assert errors == []


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate, gzip;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("identity", False),
        ("", False),
        ("gzipped", False),
    ],
)
def test_accept_encoding(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


def test_a_registry_without_a_publisher_renders_every_scrape(counting: CountingCollector) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(counting)
    srv = MetricsHTTPServer(("127.0.0.1", 0), registry, health=lambda: Health(True, "ok"))
    srv.start()
    try:
        get(srv.port)
        counting.value = 40.0
        assert b'xpu_test_events_total{what="x"} 120.0' in get(srv.port)[2]
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def busy_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExpositionCache]:
    """The daemon's registry (card, MIG, self, process and pod collectors) on the h200x8-busy node."""
    tmp = tmp_path_factory.mktemp("busy")
    clock = FakeClock()
    backend = SimulatedBackend.from_name("h200x8-busy", clock=clock)
    node = SimulatedNode(backend, tmp / "node")
    node.kubelet.socket_path = tmp / "k.sock"
    sampler = Sampler(backend, SamplerSettings(interval_seconds=5, call_deadline_seconds=5), clock=clock)
    kubelet = KubeletPodResources(node.kubelet.socket_path, refresh_interval=3600)
    attributor = Attributor(ProcResolver(node.proc_root), pod_index=PodLogIndex(node.log_root), kubelet=kubelet)
    node.start()
    try:
        snap = sampler.run_once()
        kubelet.refresh()
        attributor.update(snap)
        registry = CollectorRegistry(auto_describe=False)
        collectors = [*default_collectors(), ProcessCollector(attributor.latest), PodCollector(attributor.latest)]
        registry.register(SnapshotExporter(sampler.latest, collectors, clock=clock))
        yield ExpositionCache(registry, max_age=10.0)
    finally:
        kubelet.stop()
        node.stop()
        sampler.stop()


def test_the_busy_node_passes_both_parsers(busy_cache: ExpositionCache) -> None:
    cache = busy_cache
    text = cache.payload(TEXT).body.decode()
    om = cache.payload(OPENMETRICS).body.decode()
    families = {f.name: f for f in parse_text(text)}
    assert len({s.labels["pod"] for s in families["xpu_pod_gpu_processes"].samples}) == 100
    assert sum(s.value for s in families["xpu_pod_gpu_processes"].samples) == 400
    om_families = {f.name: f for f in parse_openmetrics(om)}
    assert {s.name for f in om_families.values() for s in f.samples} == {
        s.name for f in families.values() for s in f.samples
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_accepts_the_busy_node(busy_cache: ExpositionCache) -> None:
    """promtool reads the text format only (OpenMetrics is checked by prometheus_client's strict parser above)."""
    body = busy_cache.payload(TEXT, "gzip").body
    result = subprocess.run(["promtool", "check", "metrics"], input=gzip.decompress(body), capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_publish_renders_the_snapshot_it_is_handed_not_the_samplers_latest(clock: FakeClock) -> None:
    sim = SimulatedBackend.from_name("h200x8", clock=clock)
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5, call_deadline_seconds=5), clock=clock)
    try:
        cache = ExpositionCache(SnapshotRenderer(default_collectors(), clock=clock), max_age=60.0, interval=5.0)
        first = sampler.run_once()
        cache.publish(first)
        clock.advance(5)
        second = sampler.run_once()
        assert sampler.latest() is second

        def stamp(snapshot: Snapshot) -> str:
            uuid = snapshot.gpus[0].uuid
            return f'xpu_gpu_last_sample_timestamp_seconds{{gpu="0",uuid="{uuid}"}} {go_float(snapshot.taken_at)}\n'

        body = cache.payload(TEXT).body.decode()
        assert stamp(first) in body and stamp(second) not in body
        cache.publish(second)
        assert stamp(second) in gzip.decompress(cache.payload(TEXT, "gzip").body).decode()
    finally:
        sampler.stop()
