"""Fixtures: simulated nodes on a fake clock (tests/support/probe_node.py)."""

from tests.support.probe_node import clock, h200x1, h200x8

__all__ = ["clock", "h200x1", "h200x8"]
