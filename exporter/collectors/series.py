"""What a collector writes: series keys and values, straight to the exposition, in blocks kept under a version.

A collector declares the families of this render in order (``Family`` values: name, help, type, label names; module
constants, their HELP/TYPE lines made once), then writes each part of the node as a block::

    rows = out.block(("sample", gpu.index), gpu.sample)
    if rows is not None:  # None: this block's lines are the last render's, made under an equal version
        rows.add(TEMPERATURE, (str(gpu.index), gpu.uuid), 41.0)

A block's version is whatever its lines are made from (a card's ``DeviceSample``, its ``DeviceInfo``, a pod's
sums, a Topology): equal versions (``is`` or ``==``) must give the same lines. Within a family, lines come out
block by block in the order the blocks were asked for, as one loop over the cards per family would write them.

The same ``write`` also serves prometheus_client: ``SeriesCollector.collect`` runs it into ``MetricSink``, which
builds the families prometheus_client's own encoders take (every block written afresh), so the golden file and the
tests that read families see what the fast path writes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.encoding import TEXT_NAME_SUFFIXES, headers, legacy_names
from exporter.snapshot import Snapshot

GAUGE, COUNTER, INFO = "gauge", "counter", "info"


@dataclass(frozen=True, eq=False, slots=True)
class Family:
    """One metric family. Compared and hashed by identity: families are module constants.

    ``name`` as prometheus_client's family name (a counter's without ``_total``, an info's without ``_info``);
    ``labels`` the label names of ``Rows.add``."""

    name: str
    help: str
    type: str = GAUGE
    labels: tuple[str, ...] = ()
    unit: str = ""
    sample: str = field(init=False)  # the name on its lines: name, name_total or name_info
    text_header: str = field(init=False)
    om_header: str = field(init=False)

    def __post_init__(self) -> None:
        if self.type not in (GAUGE, COUNTER, INFO):
            raise ValueError(f"{self.name}: type must be gauge, counter or info, not {self.type!r}")
        suffix = TEXT_NAME_SUFFIXES.get(self.type, "")
        if suffix and self.name.endswith(suffix):
            raise ValueError(f"{self.name}: give a {self.type}'s name without {suffix}")
        if self.unit and not self.name.endswith("_" + self.unit):
            raise ValueError(f"{self.name}: the name of a family in {self.unit} ends with _{self.unit}")
        if not legacy_names(self.name, self.labels) or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"{self.name}: names outside the legacy character set, or a label twice: {self.labels}")
        text, om = headers(self.name, self.type, self.help, self.unit)
        object.__setattr__(self, "sample", self.name + suffix)
        object.__setattr__(self, "text_header", text)
        object.__setattr__(self, "om_header", om)


class Rows(Protocol):
    """Where one block's series go."""

    def add(self, family: Family, values: tuple[str, ...], value: float) -> None:
        """A series with ``family.labels`` set to ``values`` (an info series: value 1.0)."""

    def add_named(self, family: Family, names: tuple[str, ...], values: tuple[str, ...], value: float) -> None:
        """A series with its own label names (labels that only some series of the family carry)."""


class Exposer(Protocol):
    """What a collector writes one render into."""

    def declare(self, *families: Family) -> None:
        """The next families of this render, in order; each is written (HELP/TYPE lines) even with no series."""

    def block(self, key: Hashable, version: object) -> Rows | None:
        """Rows for the block ``key`` (unique within a collector's render), or None when its lines are kept from
        the last render because ``version`` equals the version they were made under."""


class MetricSink:
    """An Exposer that builds prometheus_client families: every block is written, nothing is kept."""

    def __init__(self) -> None:
        self._families: dict[Family, Metric] = {}

    def declare(self, *families: Family) -> None:
        for family in families:
            if family in self._families:
                raise ValueError(f"family {family.name} declared twice")
            self._families[family] = Metric(family.name, family.help, family.type, family.unit)

    def block(self, key: Hashable, version: object) -> Rows:
        return self

    def add(self, family: Family, values: tuple[str, ...], value: float) -> None:
        self.add_named(family, family.labels, values, value)

    def add_named(self, family: Family, names: tuple[str, ...], values: tuple[str, ...], value: float) -> None:
        if len(names) != len(values):
            raise ValueError(f"{family.name}: {len(values)} label values for {len(names)} names")
        metric = self._families.get(family)
        if metric is None:
            raise ValueError(f"family {family.name} written before it was declared")
        metric.samples.append(Sample(family.sample, dict(zip(names, values, strict=True)), float(value)))

    def metrics(self) -> list[Metric]:
        return list(self._families.values())


class SeriesCollector:
    """Base of the collectors that write series: ``collect`` (prometheus_client families) from ``write``."""

    name: str

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        raise NotImplementedError

    def collect(self, snapshot: Snapshot, now: float) -> Sequence[Metric]:
        sink = MetricSink()
        self.write(snapshot, now, sink)
        return sink.metrics()
