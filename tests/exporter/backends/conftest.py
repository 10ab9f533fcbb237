"""The ``backend`` fixture of the Backend contract: every backend it runs on, opened and closed; ``h200x8``, a
simulated node on the fake clock (tests/support/probe_node.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.protocol import Backend
from tests.exporter.backends.contract import BACKENDS, make_backend
from tests.support.probe_node import h200x8

__all__ = ["backend", "h200x8", "simulated"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = make_backend(request.param)
    b.open()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def simulated(backend: Backend) -> Backend:
    """The same backend, for tests that change state: never run on a real card."""
    if backend.name == "nvml":
        pytest.skip("mutating contract tests run on simulated backends only")
    return backend
