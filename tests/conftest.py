"""Shared fixtures: a simulated node, a controllable clock, free ports."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from exporter.backends.simulated import SimulatedBackend


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/ from the current output (then review the diff) instead of comparing with it",
    )


class FakeClock:
    """A wall clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
