"""The status page at /: rendering from Snapshots and providers, escaping, and the real page in headless Chromium.

Set XPU_UPDATE_SCREENSHOT=1 to refresh docs/status-page.png from the Chromium test.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerConfig
from exporter.snapshot import Snapshot
from exporter.status_page import CheckRow, FaultRow, PartitionRow, StatusProviders, render_status_page
from tests.support.clock import FakeClock
from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

ROOT = REPO
CONFIG = SamplerConfig(interval_seconds=1.0, call_deadline_seconds=0.2)


def sample(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    clock.advance(5)
    snap = s.run_once()
    s.stop()
    return snap


class Page(HTMLParser):
    """Collects text and checks that every tag the page opens it also closes (a well-formed page)."""

    VOID = frozenset({"meta", "br", "link", "img"})

    def __init__(self, text: str) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []
        self.external: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value and "//" in value:
                self.external.append(value)
        if tag == "script":
            self.external.append("<script>")
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


def test_healthy_node_page(sim: SimulatedBackend, clock: FakeClock) -> None:
    page = Page(render_status_page(sample(sim, clock), clock.now, hostname="node-a"))
    assert page.stack == [] and page.external == []
    assert "All 8 GPUs answering, no problems seen" in page.words
    assert page.words.count("NVIDIA H200") == 8
    assert "Not available in this build" in page.words  # no providers: said, not faked


def test_card_problems_are_shown_per_gpu(sim: SimulatedBackend, clock: FakeClock) -> None:
    sim.inject("nvlink_down", 3, {"link": "4"})
    sim.inject("remap_pending", 1)
    sim.inject("compute_mode", 2, {"mode": "prohibited"})
    words = Page(render_status_page(sample(sim, clock), clock.now)).words
    # a pending remap comes with the driver's request for a reset (recovery action 1): GPU 1 is bad too
    assert "GPUs 1, 3 need attention" in words
    assert "NVLink 4 down" in words and "17/18" in words
    assert "row remap pending (reset needed)" in words and "driver asks for GPU reset" in words
    assert "compute mode Prohibited" in words


def test_lost_gpu_has_no_values_and_says_why(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    sim.inject("gpu_lost", 5)
    snap = s.run_once()
    s.stop()
    words = Page(render_status_page(snap, clock.now)).words
    assert "not answering (gpu_lost)" in words and "1 not answering" in words
    assert "no current values" in words


def test_providers_fill_faults_checks_and_partitions(sim: SimulatedBackend, clock: FakeClock) -> None:
    providers = StatusProviders(
        checks=lambda: [
            CheckRow("ecc", 0, "ok"),
            CheckRow("ecc", 3, "failed", "2 DBE"),
            CheckRow("driver", None, "ok"),
        ],
        faults=lambda: [FaultRow("xid_79", 3, "fatal", "replace_node", "GPU has fallen off the bus", clock.now - 42)],
        partitions=lambda: [PartitionRow("p-1", 7, "mig", "pod default/train", "3g.71gb")],
    )
    words = Page(render_status_page(sample(sim, clock), clock.now, providers)).words
    assert "1 active fault" in words and "xid_79 3 replace_node GPU has fallen off the bus 42 s ago" in words
    assert "ecc ok failed" in words
    assert "check node GPU 0 GPU 3" in words, "node-wide checks get a column named node"
    assert "p-1 7 mig pod default/train 3g.71gb" in words


def test_everything_from_providers_is_escaped(sim: SimulatedBackend, clock: FakeClock) -> None:
    evil = '<script>alert("x")</script>'
    providers = StatusProviders(faults=lambda: [FaultRow(evil, None, "fatal", "none", evil, clock.now)])
    text = render_status_page(sample(sim, clock), clock.now, providers, hostname=evil)
    assert "<script>" not in text
    page = Page(text)
    assert page.external == [] and evil in page.words


def test_no_sample_yet() -> None:
    assert "No sample yet." in Page(render_status_page(None, 0.0)).words


def _png_size_and_colours(data: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct colours of a non-interlaced 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    colours = set()
    for y in range(0, height, 7):  # every 7th row is plenty to see whether anything was drawn
        line = raw[y * stride + 1 : (y + 1) * stride]  # filtered bytes: distinct values still show variety
        colours.update(line[i : i + channels] for i in range(0, len(line), channels * 5))
    return width, height, len(colours)


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium (Debian package) not installed")
def test_status_page_in_headless_chromium(tmp_path: Path) -> None:
    # a deadline a busy CI machine cannot miss by accident: only GPU 3 may need attention on this page
    with DaemonProcess(tmp_path, deadline=2.0) as d:
        result = d.xpuctl("simulate", "inject", "nvlink_down", "--gpu", "3", "link=4")
        assert result.returncode == 0, result.stderr
        page_text = ""
        for _ in range(200):  # the next cycles pick the fault up: card data first, then the probes' fault
            page_text = d.get("/")[1]
            if "NVLink 4 down" in page_text and "nvlink_down" in page_text:
                break
            time.sleep(0.1)
        assert "NVLink 4 down" in page_text
        assert "nvlink_down" in page_text, "the fault from the health pipeline is listed"
        shot = tmp_path / "status.png"
        base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1280,900"]  # fmt: skip
        url = f"http://127.0.0.1:{d.port}/"
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=60, check=False)
        assert dom.returncode == 0, dom.stderr[-2000:]
        words = Page(dom.stdout).words
        assert "GPU 3 needs attention" in words and "NVLink 4 down" in words
        assert "nvlink_down" in words
        run = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    width, height, colours = _png_size_and_colours(data)
    assert (width, height) == (1280, 900)
    assert colours > 20  # a rendered page, not a blank or error screen
    if os.environ.get("XPU_UPDATE_SCREENSHOT"):
        (ROOT / "docs" / "status-page.png").write_bytes(data)
