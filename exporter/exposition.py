"""/metrics made once per sampling cycle, so a scrape serves bytes instead of running every collector and encoder.

``publish`` (a sampler subscriber) collects the registry once for the new Snapshot and encodes, with
prometheus_client's own encoders, the formats scrapers asked for in the last ``HOT_SECONDS`` (text 0.0.4,
OpenMetrics 1.0.0, ...), each gzip-compressed when it was asked for with gzip. Anything else (a format or encoding
asked for the first time, ``name[]`` selections) is made on the first scrape that asks and kept until the next
Snapshot. So every body is encoded and compressed at most once per Snapshot, and nothing is rendered while no one
scrapes.

Values are those of the last render: collectors whose data changes between Snapshots (faults, partitions,
attribution) lag by at most one sampling interval. When no Snapshot came for ``max_age`` (the sampler is late or
stopped), a scrape renders again on its own thread, so ``xpu_sample_age_seconds`` keeps growing and the stale-sampler
alert still fires.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

log = structlog.get_logger("exposition")

HOT_SECONDS = 120.0  # a format asked for within this long is encoded at every publish (covers 2-minute scrapes)
MAX_FORMATS = 8  # distinct content types kept per Snapshot; beyond that (odd Accept headers) encoded per scrape
GZIP_LEVEL = 5

Encoder = Callable[["_Families"], bytes]


class Collectable(Protocol):
    def collect(self) -> Iterable[Metric]: ...


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


class _Families:
    """What the encoders read: one collect()'s metric families, replayed as often as needed."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = tuple(families)

    def collect(self) -> Iterable[Metric]:
        return self.families

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

    def __init__(self, families: _Families, made_at: float, seq: int | None) -> None:
        self.families = families
        self.made_at = made_at
        self.seq = seq  # the Snapshot it was made for (None: made on a scrape)
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
    encoder: Encoder
    at: float  # monotonic time of the last scrape that asked for it


class ExpositionCache:
    """Renders a registry once per Snapshot and answers scrapes from the result.

    ``max_age``: a render older than this is redone by the next scrape (0: every scrape renders, for a registry
    nothing publishes). Give it about two sampling intervals.
    """

    def __init__(
        self,
        registry: Collectable,
        *,
        max_age: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._max_age = max_age
        self._monotonic = monotonic
        self._lock = threading.Lock()  # guards the fields below
        self._current: _Exposition | None = None
        self._outdated = True  # a Snapshot came that _current does not show
        self._asked: dict[tuple[str, bool], _Asked] = {}
        self._render_lock = threading.Lock()  # one collect() at a time

    # ----- the sampler side --------------------------------------------------------------------------------

    def publish(self, snapshot: object | None = None) -> None:
        """A new Snapshot: render the formats scrapers use now (sampler subscriber; takes a few ms)."""
        now = self._monotonic()
        with self._lock:
            hot = {key: a.encoder for key, a in self._asked.items() if now - a.at <= HOT_SECONDS}
            for key in [k for k in self._asked if k not in hot]:
                del self._asked[key]
            self._outdated = True
        if not hot:
            return  # no one scrapes: the first scrape renders
        with self._render_lock:
            exposition = self._render(getattr(snapshot, "seq", None))
            for (content_type, compress), encoder in hot.items():
                exposition.body(encoder, content_type, compress)
            with self._lock:
                self._current, self._outdated = exposition, False

    # ----- the scrape side ---------------------------------------------------------------------------------

    def payload(self, accept: str, accept_encoding: str = "", names: Sequence[str] | None = None) -> Payload:
        """The body for one scrape: ``accept``/``accept_encoding`` are the request's headers, ``names`` its
        ``name[]`` parameters."""
        encoder, content_type = choose_encoder(accept)
        compress = accepts_gzip(accept_encoding)
        encoding = "gzip" if compress else None
        exposition = self._fresh()
        if names:
            body = encoder(exposition.families.restricted(set(names)))
            return Payload(content_type, gzip.compress(body, GZIP_LEVEL, mtime=0) if compress else body, encoding)
        key = (content_type, compress)
        with self._lock:
            keep = key in self._asked or len(self._asked) < MAX_FORMATS
            if keep:
                self._asked[key] = _Asked(encoder, self._monotonic())
        if not keep and not exposition.has(content_type, compress):
            body = encoder(exposition.families)
            return Payload(content_type, gzip.compress(body, GZIP_LEVEL, mtime=0) if compress else body, encoding)
        return Payload(content_type, exposition.body(encoder, content_type, compress), encoding)

    def latest_seq(self) -> int | None:
        """The Snapshot sequence number the served render was made for (None: none yet, or made on a scrape)."""
        with self._lock:
            return None if self._current is None else self._current.seq

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
            exposition = self._render(None)
            with self._lock:
                self._current, self._outdated = exposition, False
            return exposition
        finally:
            self._render_lock.release()

    def _render(self, seq: int | None) -> _Exposition:
        made_at = self._monotonic()
        return _Exposition(_Families(list(self._registry.collect())), made_at, seq)
