"""The Probe protocol: a plain object with a name and one method over the latest Snapshot.

Probes are read-only: they see Snapshots (and the events fed to them), never the backend's write methods. State
across evaluations (baselines, counters seen last time) lives on the probe instance; time comes in as an argument.
"""

from __future__ import annotations

from typing import Protocol

from exporter.snapshot import Snapshot
from healthd.findings import ProbeReport


class Probe(Protocol):
    name: str

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport: ...
