"""/metrics made once per sampling cycle, so a scrape serves bytes instead of running every collector and encoder.

``publish(snapshot)`` (a sampler subscriber) renders the Snapshot it is handed (the body is a function of that
Snapshot and of the collectors' own state, never of what the sampler holds by the time it runs) and encodes the
formats scrapers will ask for before the next Snapshot. Each scraper (a client host asking for one format) is
tracked with the time of its last request and the time between its requests. Until its rhythm is learned (a new
scraper, a restarted one, one that missed its expected request, a request the rhythm did not foresee) its format
is rendered at every publish while it asks at all; once its rhythm has foreseen ``SETTLE_REQUESTS`` requests in a
row (a publish rendered for each before it came), only the Snapshot each expected request will read is: the
latest whose render is ready when the request comes. A render is taken to be ready ``LEAD_MARGIN`` times the
slowest of the last ``LEAD_RENDERS`` publish renders after its publish; a request due sooner than that after a
Snapshot comes while that Snapshot renders and reads the one before, which was rendered for it (its phase repeats,
both rhythms are fixed: were it rendered for at the Snapshot it comes during, it would never read that render nor
be foreseen). With Prometheus every 15 s and a 5 s interval, one Snapshot in three is rendered (and one in three
per replica of an HA pair). ``expect`` names formats treated as asked for at start (the daemon gives Prometheus'
own), so the first scrape of a freshly started daemon is served too. Each body is encoded, and gzip-compressed
when asked for with gzip, at most once per render.

A request its rhythm did not foresee, finding no body of its format for the latest Snapshot (a scraper arriving
at a new phase: an HA replica joining, a restarted Prometheus), gets the latest body made in that format when it
is no older than ``max_age`` plus one period and the sampler is publishing: its values are then one rhythm old,
once. Otherwise, and for ``name[]`` selections, the body is made on the request's thread from the latest render,
or rendered there when there is none (a format no one asked for in the last ``HOT_SECONDS``). While a publish
renders, scrapes are served the render before. While no one scrapes, nothing is rendered.

Text 0.0.4 and OpenMetrics 1.0.0 are written by exporter/encoding.py from the render's sections (prometheus_client's
bytes); any other format the Accept header asks for by prometheus_client's own encoder.

When no Snapshot came for ``max_age`` (the sampler is late or stopped), a scrape renders the last Snapshot again on
its own thread, so ``xpu_sample_age_seconds`` keeps growing and the stale-sampler alert still fires.

A publish render is pure Python under the GIL (tens of ms, hundreds on 64 busy cards), and a scrape served during it
would otherwise wait at each handoff between the server's threads until the render is forced off the GIL (the
switch interval, 5 ms by default). Given the server's requests in flight (``give_way_to``), a publish render waits
at each of its checkpoints (between collectors and blocks, exporter/collectors/render.py) while a request is in
flight, at most ``GIVE_WAY_SECONDS`` in all, so a stuck or endless client delays a publish by that much at most; and
the switch interval is ``RENDER_SWITCH_INTERVAL`` while it renders, so the server's first wake-up meets the render
for that long at most.
"""

from __future__ import annotations

import gzip
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from exporter.encoding import Collectable, MetricLines, Rendered, Replay, encode_sections, select_sections
from exporter.inflight import RequestsInFlight
from exporter.snapshot import Snapshot

HOT_SECONDS = 120.0  # a scraper not heard from in this long (and in 3 of its periods) is forgotten
MAX_SCRAPERS = 16  # (client host, format) pairs whose rhythm is kept; beyond that encoded per scrape
GZIP_LEVEL = 1  # 0.3x the CPU of level 5 on a 4 MiB body, for 18 % more bytes
PERIOD_SMOOTHING = 0.5  # weight of the newest gap between two requests in a format's period
BURST_GAP = 0.05  # requests closer than this (one client's burst) do not change a format's period
SETTLE_REQUESTS = 2  # requests in a row the rhythm foresaw before publish renders only for expected requests
LEAD_RENDERS = 8  # a publish render is taken to be ready LEAD_MARGIN times the slowest of the last this many
LEAD_MARGIN = 1.25  # after its publish: a request due sooner reads the render before (a render it waits for: never)
GIVE_WAY_SECONDS = 0.25  # the most one publish render waits for requests in flight, whatever the clients do
GIVE_WAY_SLICE = 0.005  # a waiting render looks again this often (a request came to wait for it)
RENDER_SWITCH_INTERVAL = 0.001  # sys.setswitchinterval while a publish render runs, when giving way
OPENMETRICS = choose_encoder("application/openmetrics-text;version=1.0.0")[1]
PROMETHEUS_FORMATS = ((OPENMETRICS, True),)  # what Prometheus, its agents and the OTel receiver ask for first

Encoder = Callable[[Rendered], bytes]
Format = tuple[str, bool]  # (content type, gzip)
ScraperKey = tuple[str, str, bool]  # (client host, content type, gzip); host "" for a format expected at start


@runtime_checkable
class Renderer(Protocol):
    def render(self, snapshot: Snapshot | None, checkpoint: Callable[[], None] = ...) -> Rendered:
        """``checkpoint``, where given, is called often during the render (it may wait)."""
        ...


@dataclass(frozen=True, slots=True)
class Payload:
    content_type: str
    body: bytes
    encoding: str | None  # "gzip" or None (identity)


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header allows gzip (``gzip``, ``x-gzip`` or ``*``, without ``q=0``)."""
    for part in header.split(","):
        token, _, params = part.strip().partition(";")
        if token.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = next((p.split("=", 1)[1] for p in params.split(";") if p.strip().lower().startswith("q=")), "1")
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False


def _compress(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


class RegistryRenderer:
    """A prometheus_client registry (or any Collectable) as a Renderer: collected at every render, whatever the
    Snapshot; its lines kept between renders."""

    def __init__(self, registry: Collectable) -> None:
        self._registry = registry
        self._lines = MetricLines()

    def render(self, snapshot: Snapshot | None, checkpoint: Callable[[], None] = lambda: None) -> Rendered:
        checkpoint()  # a registry's collect is one call: the only place to wait
        families = list(self._registry.collect())
        return Rendered(self._lines.sections(families), lambda: families)


class _Exposition:
    """One render: its sections and the bodies made from them, each made once."""

    def __init__(self, rendered: Rendered, made_at: float) -> None:
        self.rendered = rendered
        self.made_at = made_at
        self._bodies: dict[Format, bytes] = {}
        self._lock = threading.Lock()

    def body(self, encoder: Encoder, key: Format) -> bytes:
        """The body in one format, made once. A gzipped body does not keep the plain one it was made from (7-16x its
        size) unless that was asked for too: Prometheus asks for gzip only."""
        content_type, compress = key
        with self._lock:  # concurrent scrapes of a body not made yet wait for the first to make it
            body = self._bodies.get(key)
            if body is None:
                plain = self._bodies.get((content_type, False))
                if plain is None:
                    plain = encoder(self.rendered)
                body = _compress(plain) if compress else plain
                self._bodies[key] = body
            return body

    def has(self, key: Format) -> bool:
        with self._lock:
            return key in self._bodies


@dataclass
class _Scraper:
    """One scraper (a client host) asking for one format: when it last did, how often it does, and whether that
    rhythm is learned."""

    format: Format
    encoder: Encoder
    last: float  # monotonic time of the last request
    period: float | None = None  # smoothed time between requests; None until the second one
    foreseen: int = 0  # requests in a row the rhythm foresaw: a publish rendered for each before it came
    requests: int = 0  # requests so far, those of one burst counted once
    rendered_for: int = 0  # the request (its number) the latest publish that expected this scraper rendered for

    def seen(self, now: float) -> None:
        """A request at ``now``; one within ``BURST_GAP`` of the last is that request again (one client's burst)."""
        gap = now - self.last
        if self.overdue(now):  # back after missing requests (a restart): a new rhythm, not one long gap in the old
            self.period = None
        elif gap >= BURST_GAP:
            self.period = gap if self.period is None else self.period + PERIOD_SMOOTHING * (gap - self.period)
        else:
            self.last = now
            return
        self.requests += 1
        self.last = now

    @property
    def settled(self) -> bool:
        return self.foreseen >= SETTLE_REQUESTS

    def expected(self, now: float, interval: float, lead: float) -> bool:
        """Whether the next request should read the render a publish at ``now`` (monotonic) starts, ready ``lead``
        seconds on: the request is due once it is ready and before the next publish's is, in [now + lead,
        now + interval + lead). One due sooner comes while it renders and reads the render before, which the
        publish before made for it (or, when none did, this one is: the request is foreseen all the same). One
        late by more than ``lead`` is still expected (it reads this render) until it is overdue by more than a
        period (at least a second): the scraper stopped, or was a burst (a person polling).

        No allowance for a request that comes early: with the scraper a little after the render is ready (its usual
        phase repeats, both run on fixed rhythms), an allowance would render the Snapshot before as well, every
        time."""
        if self.period is None or self.overdue(now):
            return False  # one request so far: no rhythm yet
        due = self.last + self.period
        if due >= now + interval + lead:
            return False  # the next publish's render is ready in time
        return due >= now + lead or due < now - lead or self.rendered_for != self.requests + 1

    def overdue(self, now: float) -> bool:
        """The request expected last is late by more than a period (at least a second)."""
        return self.period is not None and now > self.last + self.period + max(1.0, self.period)

    def forgotten(self, now: float) -> bool:
        return now - self.last > max(HOT_SECONDS, 3 * (self.period or 0.0))


def fast_formats() -> dict[str, bool]:
    """Content type -> OpenMetrics (or text), for the formats exporter/encoding.py writes exactly as
    prometheus_client does (text 0.0.4, text 1.0.0 and OpenMetrics 1.0.0 with the default underscores escaping)."""
    return {
        choose_encoder("")[1]: False,
        choose_encoder("text/plain;version=1.0.0")[1]: False,
        OPENMETRICS: True,
        choose_encoder("application/openmetrics-text")[1]: True,
    }


def _fast_encoder(openmetrics: bool) -> Encoder:
    def encode(rendered: Rendered) -> bytes:
        return encode_sections(rendered.sections, openmetrics=openmetrics)

    return encode


def _prometheus_client_encoder(chosen: Callable[[Collectable], bytes]) -> Encoder:
    def encode(rendered: Rendered) -> bytes:
        return chosen(Replay(rendered.families()))

    return encode


def restricted(families: Sequence[Metric], names: set[str]) -> list[Metric]:
    """Only the samples whose name is in ``names`` (``name[]``: ``xpu_gpu_up``, ``xpu_gpu_energy_joules_total``,
    ``xpu_gpu_info``), as prometheus_client's restricted registry selects them; families left empty are dropped."""
    kept = []
    for family in families:
        samples = [s for s in family.samples if s.name in names]
        if samples:
            m = Metric(family.name, family.documentation, family.type, family.unit)
            m.samples = samples
            kept.append(m)
    return kept


class ExpositionCache:
    """Renders each published Snapshot for the formats scrapers ask for, and answers scrapes from the result.

    ``source``: a Renderer (the daemon's collectors) or a registry, collected at every render. ``interval``:
    seconds between Snapshots; a learned format is rendered at a publish when its next request is expected to read
    that render (None: at every publish, for every format asked for recently). ``max_age``: a render older than this
    is redone by the next scrape (0: every scrape renders, for a registry nothing publishes); give it about two
    sampling intervals. ``expect``: formats treated as asked for at start.
    """

    def __init__(
        self,
        source: Renderer | Collectable,
        *,
        max_age: float,
        interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        expect: Sequence[Format] = (),
    ) -> None:
        self._renderer = source if isinstance(source, Renderer) else RegistryRenderer(source)
        self._max_age = max_age
        self._interval = interval
        self._monotonic = monotonic
        self._fast = {ct: _fast_encoder(om) for ct, om in fast_formats().items()}
        self._openmetrics = {ct for ct, om in fast_formats().items() if om}
        if unknown := [ct for ct, _ in expect if ct not in self._fast]:
            raise ValueError(f"expect: not a text or OpenMetrics 1.0 content type: {unknown}")
        self._lock = threading.Lock()  # guards the fields below
        self._snapshot: Snapshot | None = None  # the latest published
        self._published_at = float("-inf")
        self._current: _Exposition | None = None
        self._outdated = True  # a Snapshot came that _current does not show
        self._latest: dict[Format, tuple[bytes, float]] = {}  # the latest body made in each format, and when
        self._render_seconds: deque[float] = deque(maxlen=LEAD_RENDERS)  # from publish to its render serving
        started = monotonic()
        self._scrapers: dict[ScraperKey, _Scraper] = {
            ("", ct, gz): _Scraper((ct, gz), self._fast[ct], started) for ct, gz in expect
        }
        self._render_lock = threading.Lock()  # one render at a time
        self._render_waiters = 0  # requests blocked on the render lock: a publish render must not wait for them
        self._requests: RequestsInFlight | None = None
        self.renders = {"publish": 0, "request": 0}  # how often each side rendered (the daemon, benchmarks, tests)

    def give_way_to(self, requests: RequestsInFlight) -> None:
        """Publish renders wait while these requests are in flight (see the module docstring)."""
        self._requests = requests

    # ----- the sampler side --------------------------------------------------------------------------------

    def publish(self, snapshot: Snapshot | None = None) -> None:
        """A new Snapshot (a sampler subscriber): render it for the formats whose rhythm is not learned yet and
        those whose next request is expected to read this render. Takes a few ms to tens of ms, on the caller's
        thread. Without a Snapshot (a registry source), the registry is what changed."""
        now = self._monotonic()
        with self._lock:
            if snapshot is not None:
                self._snapshot = snapshot
            self._published_at = now
            for key in [k for k, a in self._scrapers.items() if a.forgotten(now)]:
                del self._scrapers[key]
            for scraper in self._scrapers.values():
                if scraper.overdue(now):  # it missed a request (restarting?): learn its rhythm again
                    scraper.foreseen = 0
            interval, lead = self._interval, LEAD_MARGIN * max(self._render_seconds, default=0.0)
            expected = {k for k, a in self._scrapers.items() if interval is None or a.expected(now, interval, lead)}
            for key in expected:
                self._scrapers[key].rendered_for = self._scrapers[key].requests + 1
            wanted = {a.format: a.encoder for k, a in self._scrapers.items() if k in expected or not a.settled}
            if not wanted:  # no request expected to read this Snapshot: one that comes anyway, see payload
                self._outdated = True
                return
        # while this renders, scrapes are served the render before (the last one serves, see _fresh)
        with self._render_lock:
            switch_interval = sys.getswitchinterval()
            checkpoint = self._checkpoint(self._requests) if self._requests is not None else None
            if checkpoint is not None and switch_interval > RENDER_SWITCH_INTERVAL:
                sys.setswitchinterval(RENDER_SWITCH_INTERVAL)  # process-wide: set back below, under the lock
            try:
                exposition = self._render("publish", checkpoint)
                bodies: dict[Format, bytes] = {}
                for fmt, encoder in wanted.items():
                    if checkpoint is not None:
                        checkpoint()  # encoding a 64-card body is another 5-9 ms under the GIL
                    bodies[fmt] = exposition.body(encoder, fmt)
            finally:
                sys.setswitchinterval(switch_interval)
            with self._lock:
                self._current, self._outdated = exposition, False
                self._latest.update({fmt: (body, exposition.made_at) for fmt, body in bodies.items()})
                self._render_seconds.append(self._monotonic() - now)

    def _checkpoint(self, requests: RequestsInFlight) -> Callable[[], None]:
        """A publish render's checkpoint: while a request is in flight, wait (without the GIL), and stop waiting
        for good once this render waited ``GIVE_WAY_SECONDS``, or at once while a request waits for this render
        (the first scrape, before any render finished: it holds a place in flight and needs the render lock)."""
        deadline = time.monotonic() + GIVE_WAY_SECONDS

        def checkpoint() -> None:
            while requests.busy and not self._render_waiters:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                requests.wait_idle(min(left, GIVE_WAY_SLICE))

        return checkpoint

    # ----- the scrape side ---------------------------------------------------------------------------------

    def payload(
        self, accept: str, accept_encoding: str = "", names: Sequence[str] | None = None, client: str = "?"
    ) -> Payload:
        """The body for one scrape: ``accept``/``accept_encoding`` are the request's headers, ``names`` its
        ``name[]`` parameters, ``client`` the scraper's host (its rhythm is learned apart from other scrapers')."""
        chosen, content_type = choose_encoder(accept)
        compress = accepts_gzip(accept_encoding)
        encoding = "gzip" if compress else None
        if names:  # rare: made from the latest render, never kept
            rendered = self._fresh().rendered
            if content_type in self._fast:
                om = content_type in self._openmetrics
                body = encode_sections(select_sections(rendered.sections, set(names)), openmetrics=om)
            else:
                body = chosen(Replay(restricted(rendered.families(), set(names))))
            return Payload(content_type, _compress(body) if compress else body, encoding)
        fmt: Format = (content_type, compress)
        key: ScraperKey = (client, content_type, compress)
        encoder = self._fast.get(content_type) or _prometheus_client_encoder(chosen)
        now = self._monotonic()
        with self._lock:
            self._scrapers.pop(("", content_type, compress), None)  # the scraper expected at start is here
            scraper = self._scrapers.get(key)
            if scraper is None and len(self._scrapers) < MAX_SCRAPERS:
                scraper = self._scrapers[key] = _Scraper(fmt, encoder, now, requests=1)
            elif scraper is not None:
                scraper.seen(now)
            current, outdated = self._current, self._outdated
            if scraper is not None:  # did a publish render for this request before it came? Until it did for
                # SETTLE_REQUESTS in a row, publish renders this format every time
                scraper.foreseen = scraper.foreseen + 1 if scraper.rendered_for == scraper.requests else 0
            if current is not None and not outdated and now - current.made_at <= self._max_age and current.has(fmt):
                return Payload(content_type, current.body(encoder, fmt), encoding)
            if scraper is not None:
                latest = self._latest.get(fmt)
                if (current is None or outdated) and latest is not None and self._recent(fmt, latest[1], now):
                    return Payload(content_type, latest[0], encoding)
        exposition = self._fresh()
        body = exposition.body(encoder, fmt)
        with self._lock:
            if scraper is not None:
                self._latest[fmt] = (body, exposition.made_at)
        return Payload(content_type, body, encoding)

    def _recent(self, fmt: Format, made_at: float, now: float) -> bool:
        """Whether a request no rhythm foresaw may have its format's latest body, made at ``made_at`` (called under
        the lock): the sampler is publishing, and that body is no older than max_age plus the longest period of
        the format's scrapers (the body a settled scraper reads is about that old when the next one is made)."""
        period = max((a.period or 0.0 for a in self._scrapers.values() if a.format == fmt), default=0.0)
        return now - made_at <= self._max_age + period and now - self._published_at <= self._max_age

    def _fresh(self) -> _Exposition:
        """The render to serve; renders on this thread when there is none, it is outdated (no one was scraping
        when the last Snapshot came) or older than max_age. While another thread renders, the last one serves."""
        with self._lock:
            current, outdated = self._current, self._outdated
        if current is not None and not outdated and self._monotonic() - current.made_at <= self._max_age:
            return current
        if current is not None and not self._render_lock.acquire(blocking=False):
            return current
        if current is None:
            with self._lock:
                self._render_waiters += 1  # a publish render stops giving way to requests (this one is in flight)
            try:
                self._render_lock.acquire()
            finally:
                with self._lock:
                    self._render_waiters -= 1
        try:
            with self._lock:  # another scrape may have rendered while this one waited
                if self._current is not None and self._current is not current and not self._outdated:
                    return self._current
            exposition = self._render("request")
            with self._lock:
                self._current, self._outdated = exposition, False
            return exposition
        finally:
            self._render_lock.release()

    def _render(self, side: str, checkpoint: Callable[[], None] | None = None) -> _Exposition:
        """Called with the render lock held."""
        with self._lock:
            snapshot = self._snapshot
        made_at = self._monotonic()
        self.renders[side] += 1
        rendered = (
            self._renderer.render(snapshot) if checkpoint is None else self._renderer.render(snapshot, checkpoint)
        )
        return _Exposition(rendered, made_at)
