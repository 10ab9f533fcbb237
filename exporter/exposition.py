"""/metrics made once per sampling cycle, so a scrape serves bytes instead of running every collector and encoder.

``publish`` (a sampler subscriber) collects the registry for the new Snapshot and encodes the formats that scrapers
will ask for before the next Snapshot: each format asked for is tracked with the time of its last request and the
time between requests, so with Prometheus scraping every 15 s and a 5 s sampling interval one Snapshot in three is
rendered, right before the scrape that reads it. Each body is encoded, and gzip-compressed when it was asked for
with gzip, at most once per Snapshot. A request nothing predicted (a format asked for the first time, a scraper
off its rhythm, ``name[]`` selections) is rendered on its own thread, then kept until the next Snapshot. While no one
scrapes, nothing is rendered.

Text 0.0.4 and OpenMetrics 1.0.0 go through exporter/encoding.py (prometheus_client's bytes, faster); any other
format the Accept header asks for through prometheus_client's own encoder.

Values are those of the last render: collectors whose data changes between Snapshots (faults, partitions,
attribution) lag by at most one sampling interval. When no Snapshot came for ``max_age`` (the sampler is late or
stopped), a scrape renders again on its own thread, so ``xpu_sample_age_seconds`` keeps growing and the stale-sampler
alert still fires.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from exporter.encoding import CachingEncoder, Collectable, Replay

HOT_SECONDS = 120.0  # a format not asked for in this long (and in 3 of its periods) is forgotten
MAX_FORMATS = 8  # distinct content types kept per Snapshot; beyond that (odd Accept headers) encoded per scrape
GZIP_LEVEL = 5
PERIOD_SMOOTHING = 0.5  # weight of the newest gap between two requests in a format's period
BURST_GAP = 0.05  # requests closer than this (one client's burst) do not change a format's period

Encoder = Callable[["_Families"], bytes]


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


class _Families(Replay):
    """What the encoders read: one render's families, or a ``name[]`` selection of them."""

    def restricted(self, names: set[str]) -> _Families:
        """Only the samples whose name is in ``names`` (``name[]``: ``xpu_gpu_up``, ``xpu_gpu_energy_joules_total``,
        ``xpu_gpu_info``), as prometheus_client's restricted registry selects them."""
        kept = []
        for family in self.families:
            samples = [s for s in family.samples if s.name in names]
            if samples:
                m = Metric(family.name, family.documentation, family.type, family.unit)
                m.samples = samples
                kept.append(m)
        return _Families(kept)


class _Exposition:
    """One render: the collected families and the bodies made from them, each made once."""

    def __init__(self, families: _Families, made_at: float) -> None:
        self.families = families
        self.made_at = made_at
        self._bodies: dict[tuple[str, bool], bytes] = {}
        self._lock = threading.Lock()

    def body(self, encoder: Encoder, content_type: str, compress: bool) -> bytes:
        key = (content_type, compress)
        with self._lock:  # concurrent scrapes of a body not made yet wait for the first to make it
            body = self._bodies.get(key)
            if body is None:
                plain = self._bodies.get((content_type, False))
                if plain is None:
                    plain = encoder(self.families)
                    self._bodies[(content_type, False)] = plain
                body = gzip.compress(plain, compresslevel=GZIP_LEVEL, mtime=0) if compress else plain
                self._bodies[key] = body
            return body

    def has(self, content_type: str, compress: bool) -> bool:
        with self._lock:
            return (content_type, compress) in self._bodies


@dataclass
class _Asked:
    """One format scrapers ask for: when they last did, and how often they do."""

    encoder: Encoder
    last: float  # monotonic time of the last request
    period: float | None = None  # smoothed time between requests; None until the second one

    def seen(self, now: float) -> None:
        gap = now - self.last
        if gap >= BURST_GAP:
            self.period = gap if self.period is None else self.period + PERIOD_SMOOTHING * (gap - self.period)
        self.last = now

    def expected(self, now: float, horizon: float) -> bool:
        """Whether the next request is expected before ``horizon`` (monotonic), i.e. before the next Snapshot.

        No allowance for a request that comes early: with the scraper a little after a Snapshot (its usual phase
        repeats, both run on fixed rhythms), an allowance would render the Snapshot before as well, every time; a
        request that does come early is rendered on its own thread. A request overdue by more than a period (at
        least a second) is no longer expected: the scraper stopped, or was a burst (a person polling)."""
        if self.period is None:
            return False  # one request so far: no rhythm yet
        due = self.last + self.period
        return due < horizon and now <= due + max(1.0, self.period)

    def forgotten(self, now: float) -> bool:
        return now - self.last > max(HOT_SECONDS, 3 * (self.period or 0.0))


def fast_encoders() -> dict[str, Encoder]:
    """Content type -> this module's encoder, for the formats exporter/encoding.py writes exactly as prometheus_client
    does (text 0.0.4, text 1.0.0 and OpenMetrics 1.0.0 with the default underscores escaping)."""
    text_fallback, text_type = choose_encoder("")
    om_fallback, om_type = choose_encoder("application/openmetrics-text;version=1.0.0")
    text = CachingEncoder(openmetrics=False, fallback=text_fallback)
    om = CachingEncoder(openmetrics=True, fallback=om_fallback)
    return {
        text_type: text,
        choose_encoder("text/plain;version=1.0.0")[1]: text,
        om_type: om,
        choose_encoder("application/openmetrics-text")[1]: om,
    }


class ExpositionCache:
    """Renders a registry once per Snapshot and answers scrapes from the result.

    ``interval``: seconds between Snapshots; ``publish`` renders a format when a request for it is expected within
    that long (None: at every publish, for every format asked for recently). ``max_age``: a render older than this is
    redone by the next scrape (0: every scrape renders, for a registry nothing publishes); give it about two
    sampling intervals.
    """

    def __init__(
        self,
        registry: Collectable,
        *,
        max_age: float,
        interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._max_age = max_age
        self._interval = interval
        self._monotonic = monotonic
        self._fast = fast_encoders()
        self._lock = threading.Lock()  # guards the fields below
        self._current: _Exposition | None = None
        self._outdated = True  # a Snapshot came that _current does not show
        self._asked: dict[tuple[str, bool], _Asked] = {}
        self._render_lock = threading.Lock()  # one collect() at a time

    # ----- the sampler side --------------------------------------------------------------------------------

    def publish(self, snapshot: object | None = None) -> None:
        """A new Snapshot (a sampler subscriber: the collectors read the latest one themselves): render the formats
        a request is expected for before the next one. Takes a few ms to tens of ms, on the caller's thread."""
        now = self._monotonic()
        horizon = now + self._interval if self._interval is not None else None
        with self._lock:
            for key in [k for k, a in self._asked.items() if a.forgotten(now)]:
                del self._asked[key]
            hot = {key: a.encoder for key, a in self._asked.items() if horizon is None or a.expected(now, horizon)}
            self._outdated = True
        if not hot:
            return  # no request expected before the next Snapshot: a request that comes anyway renders
        with self._render_lock:
            exposition = self._render()
            for (content_type, compress), encoder in hot.items():
                exposition.body(encoder, content_type, compress)
            with self._lock:
                self._current, self._outdated = exposition, False

    # ----- the scrape side ---------------------------------------------------------------------------------

    def payload(self, accept: str, accept_encoding: str = "", names: Sequence[str] | None = None) -> Payload:
        """The body for one scrape: ``accept``/``accept_encoding`` are the request's headers, ``names`` its
        ``name[]`` parameters."""
        chosen, content_type = choose_encoder(accept)
        encoder: Encoder = self._fast.get(content_type, chosen)
        compress = accepts_gzip(accept_encoding)
        encoding = "gzip" if compress else None
        exposition = self._fresh()
        if names:  # rare: prometheus_client's encoder, leaving the fast encoders' line caches to the full renders
            body = chosen(exposition.families.restricted(set(names)))
            return Payload(content_type, gzip.compress(body, GZIP_LEVEL, mtime=0) if compress else body, encoding)
        key = (content_type, compress)
        with self._lock:
            asked = self._asked.get(key)
            keep = asked is not None or len(self._asked) < MAX_FORMATS
            if asked is not None:
                asked.seen(self._monotonic())
            elif keep:
                self._asked[key] = _Asked(encoder, self._monotonic())
        if not keep and not exposition.has(content_type, compress):
            body = encoder(exposition.families)
            return Payload(content_type, gzip.compress(body, GZIP_LEVEL, mtime=0) if compress else body, encoding)
        return Payload(content_type, exposition.body(encoder, content_type, compress), encoding)

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
            self._render_lock.acquire()
        try:
            with self._lock:  # another scrape may have rendered while this one waited
                if self._current is not None and self._current is not current and not self._outdated:
                    return self._current
            exposition = self._render()
            with self._lock:
                self._current, self._outdated = exposition, False
            return exposition
        finally:
            self._render_lock.release()

    def _render(self) -> _Exposition:
        made_at = self._monotonic()
        return _Exposition(_Families(list(self._registry.collect())), made_at)
