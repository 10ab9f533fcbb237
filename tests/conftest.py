"""Shared fixtures: a simulated node and a controllable clock; the --update-golden option; logging set-up that a
test changes (a benchmark's main() configures structlog for the daemon) is put back after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, settings

from exporter.backends.simulated import SimulatedBackend
from tests.support.clock import FakeClock


def pytest_configure(config: pytest.Config) -> None:
    """Tests never assert wall-clock times, and hypothesis' deadline and too_slow check are wall-clock times: on a
    loaded 2-core CI machine a trivial strategy once took 1.8 s to draw one example. The examples still run."""
    settings.register_profile("no-timing", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("no-timing")


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


@pytest.fixture(autouse=True)
def _structlog_put_back() -> Iterator[None]:
    """Without it a test that logs at info (structlog.testing.capture_logs) sees nothing after one that set the level
    to warning, depending on the order the tests run in."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
