"""Fixtures: simulated nodes on the fake clock of tests/conftest.py (tests/support/probe_node.py)."""

from tests.support.probe_node import h200x1, h200x8

__all__ = ["h200x1", "h200x8"]
