"""Shared fixtures: a simulated node and a controllable clock; the --update-golden option."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.simulated import SimulatedBackend
from tests.support.clock import FakeClock


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/ from the current output (then review the diff) instead of comparing with it",
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[SimulatedBackend]:
    backend = SimulatedBackend.from_name("h200x8", clock=clock)
    backend.open()
    yield backend
    backend.clear()  # releases any hang so worker threads can finish
    backend.close()
