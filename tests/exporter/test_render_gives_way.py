"""A publish render steps out of the way of the requests the HTTP server is answering (exporter/inflight.py), and
never for longer than its bound.

No test here times anything: each one proves an order of events (the render waited while a request was in flight,
and went on once it was answered) or that a publish finishes where waiting without a bound would never let it.
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from exporter import exposition
from exporter.encoding import MetricLines, Rendered
from exporter.exposition import ExpositionCache
from exporter.http import Health, MetricsHTTPServer
from exporter.inflight import RequestsInFlight
from exporter.snapshot import Snapshot

TEXT = "text/plain;version=0.0.4"
WAIT = 10.0  # seconds any step may take before the test fails (a bound for a broken build, not a measurement)


class Watched(RequestsInFlight):
    """RequestsInFlight that says when a render starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait_idle(self, timeout: float) -> bool:
        self.waiting.set()
        return super().wait_idle(timeout)


class Checkpointed:
    """A renderer that calls its checkpoint ``blocks`` times (its blocks), running ``between`` after each."""

    def __init__(self, blocks: int = 1, between: Callable[[int], None] = lambda i: None) -> None:
        self.blocks, self.between = blocks, between
        self.renders = 0
        self.switch_intervals: list[float] = []
        self._lines = MetricLines()

    def render(self, snapshot: Snapshot | None, checkpoint: Callable[[], None] = lambda: None) -> Rendered:
        self.renders += 1
        self.switch_intervals.append(sys.getswitchinterval())
        for i in range(self.blocks):
            checkpoint()
            self.between(i)
        family = GaugeMetricFamily("xpu_test_renders", "Renders so far.")
        family.add_metric([], self.renders)
        return Rendered(self._lines.sections([family]), lambda: [family])


@pytest.fixture
def requests() -> Watched:
    return Watched()


def publishing(cache: ExpositionCache) -> threading.Thread:
    thread = threading.Thread(target=cache.publish, daemon=True)
    thread.start()
    return thread


def test_requests_in_flight_count_begins_and_ends() -> None:
    requests = RequestsInFlight()
    assert not requests.busy
    requests.begin()
    requests.begin()
    requests.end()
    assert requests.busy, "one of two requests still in flight"
    requests.end()
    assert not requests.busy
    assert requests.wait_idle(0)
    with pytest.raises(RuntimeError):
        requests.end()


def test_a_request_in_flight_pauses_the_render_at_its_next_checkpoint(requests: Watched) -> None:
    events: list[str] = []
    renderer = Checkpointed(blocks=2, between=lambda i: events.append(f"block {i}"))
    cache = ExpositionCache(renderer, max_age=10.0)
    cache.give_way_to(requests)
    cache.payload(TEXT)  # the first render, on the request; the format is now asked for
    events.clear()
    requests.begin()
    thread = publishing(cache)
    assert requests.waiting.wait(WAIT), "the render waits at its first checkpoint"
    events.append("request answered")
    requests.end()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert events == ["request answered", "block 0", "block 1"]
    assert renderer.renders == 2


def test_the_render_waits_for_a_real_request_until_its_answer_is_written(requests: Watched) -> None:
    """/healthz answers only once the render waits: the render cannot finish unless the server's request counted,
    and the answer reaches the client before the render goes on."""
    events: list[str] = []

    def health() -> Health:
        assert requests.waiting.wait(WAIT), "the render waits while this request is in flight"
        events.append("health answered")
        return Health(True, "ok")

    publish = threading.Event()

    def block(i: int) -> None:
        events.append(f"block {i}")
        if i == 0 and publish.is_set():  # a request comes while the publish renders
            client.start()
            deadline = time.monotonic() + WAIT
            while not requests.busy and time.monotonic() < deadline:
                time.sleep(0.001)

    renderer = Checkpointed(blocks=3, between=block)
    cache = ExpositionCache(renderer, max_age=10.0)
    server = MetricsHTTPServer(("127.0.0.1", 0), cache, health=health)
    server.requests = requests  # before start: the server counts into this one
    cache.give_way_to(requests)
    cache.payload(TEXT)
    events.clear()
    replies: list[int] = []

    def get() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
        try:
            conn.request("GET", "/healthz")
            replies.append(conn.getresponse().status)
        finally:
            conn.close()

    client = threading.Thread(target=get, daemon=True)
    server.start()
    publish.set()
    try:
        thread = publishing(cache)
        thread.join(WAIT)
        assert not thread.is_alive()
        client.join(WAIT)
    finally:
        server.stop()
    assert replies == [200]
    assert events == ["block 0", "health answered", "block 1", "block 2"]


def test_a_stuck_request_delays_a_publish_by_the_bound_at_most(
    requests: Watched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exposition, "GIVE_WAY_SECONDS", 0.05)
    renderer = Checkpointed(blocks=1000)
    cache = ExpositionCache(renderer, max_age=10.0)
    cache.give_way_to(requests)
    cache.payload(TEXT)
    requests.begin()  # never ends: a client that stopped reading its answer
    thread = publishing(cache)
    thread.join(WAIT)  # 1000 checkpoints, each waiting for the request, would take 1000 times the bound
    assert not thread.is_alive(), "the publish finished with the request still in flight"
    assert requests.waiting.is_set()
    assert b"xpu_test_renders 2.0" in cache.payload(TEXT).body


def test_a_render_does_not_wait_for_a_request_that_waits_for_it(
    requests: Watched, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first scrape before any render finished waits on the render lock while it is in flight: the publish
    render stops waiting for requests at once, long before its bound."""
    monkeypatch.setattr(exposition, "GIVE_WAY_SECONDS", 3600.0)
    go_on = threading.Event()
    renderer = Checkpointed(blocks=2, between=lambda i: i or go_on.wait(WAIT))
    cache = ExpositionCache(renderer, max_age=10.0, expect=[(choose_encoder(TEXT)[1], False)])
    cache.give_way_to(requests)
    thread = publishing(cache)
    bodies: list[bytes] = []
    requests.begin()  # the scrape is in flight
    scrape = threading.Thread(target=lambda: bodies.append(cache.payload(TEXT).body), daemon=True)
    scrape.start()
    go_on.set()  # the render reaches its second checkpoint with the scrape in flight and waiting for the lock
    thread.join(WAIT)
    scrape.join(WAIT)
    requests.end()
    assert not thread.is_alive()
    assert not scrape.is_alive()
    assert bodies and b"xpu_test_renders" in bodies[0]


def test_the_switch_interval_is_short_only_while_a_publish_renders(requests: Watched) -> None:
    before = sys.getswitchinterval()
    renderer = Checkpointed()
    cache = ExpositionCache(renderer, max_age=0.0)
    cache.payload(TEXT)  # renders on the request: no shorter interval
    cache.give_way_to(requests)
    cache.publish()
    assert renderer.switch_intervals == [before, min(before, exposition.RENDER_SWITCH_INTERVAL)]
    assert sys.getswitchinterval() == before


@pytest.fixture
def server() -> Iterator[MetricsHTTPServer]:
    cache = ExpositionCache(Checkpointed(), max_age=10.0)
    srv = MetricsHTTPServer(("127.0.0.1", 0), cache, health=lambda: Health(True, "ok"))
    srv.start()
    yield srv
    srv.stop()


def test_no_request_stays_in_flight_once_answered_refused_or_dropped(server: MetricsHTTPServer) -> None:
    """A count left above zero would make every render wait its whole bound."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    for _ in range(3):  # kept alive
        conn.request("GET", "/metrics")
        assert conn.getresponse().read()
    conn.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as s:  # pipelined
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = b""
        while seen.count(b"HTTP/1.1 200") < 2:
            seen += s.recv(65536)
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as s:  # gone in the middle of a head
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as s:  # gone before its answer
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert server.requests.wait_idle(WAIT)
