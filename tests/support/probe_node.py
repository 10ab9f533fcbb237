"""A simulated node, a sampler over it and a fake clock: real Snapshots for the probes and watchers under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.findings import Finding, ProbeReport
from tests.support.clock import FakeClock

INTERVAL = 5.0


class Node:
    """``tick()`` moves time one sampling interval on and returns a real Snapshot from the Sampler."""

    def __init__(self, scenario: str, clock: FakeClock, *, deadline: float = 2.0) -> None:
        self.clock = clock
        self.backend = SimulatedBackend(load_scenario(scenario), clock=clock)
        self.sampler = Sampler(
            self.backend, SamplerSettings(interval_seconds=INTERVAL, call_deadline_seconds=deadline), clock=clock
        )

    def inject(self, kind: str, gpu: int = 0, **params: object) -> None:
        self.backend.inject(kind, gpu, {k: str(v) for k, v in params.items()})

    def tick(self, seconds: float = INTERVAL) -> Snapshot:
        self.clock.advance(seconds)
        snap = self.sampler.run_once()
        assert self.sampler.wait_subscribers(), "subscribers handled the snapshot"
        return snap

    def close(self) -> None:
        self.backend.clear()
        self.sampler.stop(timeout=1.0)


@pytest.fixture
def h200x8(clock: FakeClock) -> Iterator[Node]:
    node = Node("h200x8", clock)
    yield node
    node.close()


@pytest.fixture
def h200x1(clock: FakeClock) -> Iterator[Node]:
    node = Node("h200x1", clock)
    yield node
    node.close()


def codes(report: ProbeReport, gpu: int | None = None) -> set[str]:
    return {f.code for f in report.findings if gpu is None or (f.gpu is not None and f.gpu.index == gpu)}


def only(report: ProbeReport, code: str) -> Finding:
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, f"expected one {code}, got {[f.code for f in report.findings]}"
    return found[0]


def status(report: ProbeReport, gpu: int) -> str:
    return next(str(r.status) for r in report.results if r.gpu is not None and r.gpu.index == gpu)
