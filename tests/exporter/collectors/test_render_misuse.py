"""A collector that misuses the Exposer (exporter/collectors/render.py): a block asked for twice in one render (kept
or written), a family written but not declared. Its render fails, as a bug should, and costs only its own series:
what it had kept before still serves the next render."""

from __future__ import annotations

import pytest

from exporter.collectors.render import SnapshotRenderer
from exporter.collectors.series import GAUGE, Exposer, Family, SeriesCollector
from exporter.encoding import encode_sections
from exporter.snapshot import Snapshot

DECLARED = Family("xpu_test_declared", "Declared.", GAUGE, ("key",))
UNDECLARED = Family("xpu_test_undeclared", "Not declared.", GAUGE, ("key",))


class Misuse(SeriesCollector):
    name = "misuse"

    def __init__(self) -> None:
        self.keys: list[str] = ["a"]
        self.undeclared = False
        self.value = 1.0

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(DECLARED)
        for key in self.keys:
            if (rows := out.block(key, self.value)) is not None:
                rows.add(UNDECLARED if self.undeclared else DECLARED, (key,), self.value)


def _text(renderer: SnapshotRenderer, snapshot: Snapshot) -> bytes:
    return encode_sections(renderer.render(snapshot).sections, openmetrics=False)


@pytest.mark.parametrize("twice", ["kept", "written"])
def test_a_block_asked_for_twice_fails_the_collectors_render_only(snapshot: Snapshot, twice: str) -> None:
    misuse = Misuse()
    renderer = SnapshotRenderer([misuse], clock=lambda: 1.0, monotonic=lambda: 0.0)
    assert b'xpu_test_declared{key="a"} 1.0\n' in _text(renderer, snapshot)
    misuse.keys = ["a", "b", "a"]
    if twice == "written":
        misuse.value = 2.0
    text = _text(renderer, snapshot)
    assert b'xpu_collector_success{collector="misuse"} 0.0' in text
    assert b"xpu_test_declared{" not in text
    misuse.keys = ["a"]
    text = _text(renderer, snapshot)
    assert b'xpu_collector_success{collector="misuse"} 1.0' in text
    assert f'xpu_test_declared{{key="a"}} {misuse.value}\n'.encode() in text


def test_a_family_written_but_not_declared_fails_the_collectors_render_only(snapshot: Snapshot) -> None:
    misuse = Misuse()
    renderer = SnapshotRenderer([misuse], clock=lambda: 1.0, monotonic=lambda: 0.0)
    _text(renderer, snapshot)
    misuse.undeclared, misuse.value = True, 2.0
    text = _text(renderer, snapshot)
    assert b'xpu_collector_success{collector="misuse"} 0.0' in text
    assert b"xpu_test_undeclared" not in text
    misuse.undeclared, misuse.value = False, 1.0  # the version of the block kept from the first render
    text = _text(renderer, snapshot)
    assert b'xpu_collector_success{collector="misuse"} 1.0' in text
    assert b'xpu_test_declared{key="a"} 1.0\n' in text
