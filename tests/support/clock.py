"""A wall clock that tests move by hand."""

from __future__ import annotations


class FakeClock:
    """A wall clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
