"""Backend call counters: how many calls, errors (by code) and timeouts each call name has had since start."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class CallCounters:
    """Running totals of backend calls by call name (backend method) since the daemon started."""

    calls: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    errors: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))  # (call, code)
    timeouts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


class Counters:
    """The running totals the lanes add to, from any thread; ``freeze()`` is what a Snapshot carries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._timeouts: Counter[str] = Counter()

    def call(self, name: str) -> None:
        with self._lock:
            self._calls[name] += 1

    def error(self, name: str, code: str) -> None:
        with self._lock:
            self._errors[(name, code)] += 1

    def timeout(self, name: str) -> None:
        with self._lock:
            self._timeouts[name] += 1

    def freeze(self) -> CallCounters:
        with self._lock:
            return CallCounters(
                calls=MappingProxyType(dict(self._calls)),
                errors=MappingProxyType(dict(self._errors)),
                timeouts=MappingProxyType(dict(self._timeouts)),
            )
