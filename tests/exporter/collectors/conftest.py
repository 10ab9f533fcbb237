"""The renderer tests' snapshot: one cycle of a simulated one-card node, sampled once per module. A module that needs
a snapshot on the shared ``sim`` and ``clock`` (test_card_metrics, test_dcgm_compat, test_dcgm_versions) defines its
own ``snapshot``, which overrides this one there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot


@pytest.fixture(scope="module")
def snapshot() -> Iterator[Snapshot]:
    sim = SimulatedBackend.from_name("h200x1")
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5, call_deadline_seconds=5))
    try:
        yield sampler.run_once()
    finally:
        sampler.stop()
