"""The ``backend`` fixture of the Backend contract: every backend it runs on, opened and closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.backends.protocol import Backend
from tests.exporter.backends.contract import BACKENDS, make_backend


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
