"""Polling until something happens: the tests' only waits on another thread or process (never a time assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(condition: Callable[[], object], timeout: float, *, step: float = 0.01) -> bool:
    """Whether condition() became true within ``timeout`` seconds (it is asked once more when the time is up)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def wait_until(predicate: Callable[[], T], what: str, limit: float = 60.0, *, step: float = 0.05) -> T:
    """The first true value predicate() returns; fails the test, naming ``what``, if none comes within ``limit``."""
    deadline = time.monotonic() + limit
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting {limit}s: {what}")
        time.sleep(step)
    return value
