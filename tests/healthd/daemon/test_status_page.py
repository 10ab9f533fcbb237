"""The status page at /: rendering from Snapshots, check states, faults and partitions, escaping, and the real page
in headless Chromium.

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

from exporter.attribution.attributor import Allocation, Attribution
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.status_page import render_status_page
from healthd.faults.engine import CheckState
from healthd.faults.fault import Fault, new_fault
from healthd.findings import Action, CheckResult, CheckStatus, Finding, GpuRef, Severity
from healthd.partition.model import CardMode, MigPlacement, Owner, OwnerKind, PartitionRecord, State
from healthd.probes.memory_leak import MemoryLeakProbe
from tests.support import png
from tests.support.clock import FakeClock
from tests.support.daemon_process import DaemonProcess
from tests.support.faults_helpers import make_engine
from tests.support.paths import REPO

ROOT = REPO
# nothing here hangs a card: a deadline a busy CI machine cannot miss by accident (at 0.2 s a simulated profiling
# call once took 0.27 s, and two cards showed as not answering on a page that expected none)
CONFIG = SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0)
IDLE_GPU = 6  # the simulated h200x8 node runs no process on GPU 6


def sample(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    clock.advance(5)
    snap = s.run_once()
    s.stop()
    return snap


class Page(HTMLParser):
    """Collects text, the pills of each table row, and checks that every tag the page opens it also closes."""

    VOID = frozenset({"meta", "br", "link", "img"})

    def __init__(self, text: str) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []
        self.external: list[str] = []
        self.tables = 0
        self.rows: list[tuple[int, str, list[str]]] = []  # (table number from 1, row class, cell texts)
        self.pills: list[list[tuple[str, str, str]]] = []  # per row: (level, text, title)
        self.banner = ("", "")
        self._in: str | None = None  # "pill", "banner" or "cell" while collecting its text
        self._class = ""
        self._title = ""
        self._buffer: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {k: v or "" for k, v in attrs}
        for name, value in attrs:
            if name in ("src", "href") and value and "//" in value:
                self.external.append(value)
        if tag == "script":
            self.external.append("<script>")
        if tag == "table":
            self.tables += 1
        elif tag == "tr":
            self.rows.append((self.tables, named.get("class", ""), []))
            self.pills.append([])
        elif tag in ("td", "th"):
            self.rows[-1][2].append("")
        classes = named.get("class", "").split()
        if tag == "span" and "pill" in classes:
            self._in, self._class, self._title, self._buffer = "pill", classes[-1], named.get("title", ""), []
        elif tag == "div" and "banner" in classes:
            self._in, self._class, self._buffer = "banner", classes[-1], []
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()
        if tag == "span" and self._in == "pill":
            self.pills[-1].append((self._class, "".join(self._buffer), self._title))
            self._in = None
        elif tag == "div" and self._in == "banner":
            self.banner = (self._class, "".join(self._buffer))
            self._in = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in is not None:
            self._buffer.append(data)
        if self.rows and {"td", "th"} & set(self.stack[-3:]):
            cells = self.rows[-1][2]
            cells[-1] = " ".join(f"{cells[-1]} {data}".split())

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())

    def gpu(self, index: int) -> tuple[str, list[tuple[str, str, str]]]:
        """GPU ``index``'s row in the GPUs table (the first): its row class and its state pills."""
        for (table, klass, cells), pills in zip(self.rows, self.pills, strict=True):
            if table == 1 and cells and cells[0] == str(index):
                return klass, pills
        raise AssertionError(f"no row for GPU {index}")


def gpu(index: int | None) -> GpuRef | None:
    return None if index is None else GpuRef(index, f"GPU-{index}", f"0000:{index + 0x18:02x}:00.0")


def check(name: str, index: int | None, status: CheckStatus, detail: str = "") -> CheckState:
    return CheckState(CheckResult(name, gpu(index), status, detail), at=0.0)


def fault(
    code: str, index: int | None, severity: Severity, action: Action, message: str, since: float, name: str = "test"
) -> Fault:
    finding = Finding(name, code, severity, action, message, gpu(index))
    return new_fault(finding, opened_seq=1, now=since, boot_id="boot-1", action=action, evidence={})


def test_healthy_node_page(sim: SimulatedBackend, clock: FakeClock) -> None:
    page = Page(render_status_page(sample(sim, clock), clock.now, hostname="node-a"))
    assert page.stack == [] and page.external == []
    assert page.banner == ("ok", "All 8 GPUs answering; no health checks in this build")
    assert page.words.count("NVIDIA H200") == 8
    assert "Not available in this build" in page.words  # no sources: said, not faked
    assert all(page.gpu(i) == ("ok-row", [("ok", "ok", "")]) for i in range(8))


def test_without_checks_and_faults_the_page_invents_no_problems(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    sim.inject("nvlink_down", 3, {"link": "4"})
    sim.inject("remap_pending", 1)
    sim.inject("ecc", 0, {"uncorrected": "2", "corrected": "10"})
    sim.inject("compute_mode", 2, {"mode": "prohibited"})
    sim.inject("orphan_memory", IDLE_GPU, {"memory_mib": "2048"})
    clock.advance(5)
    page = Page(render_status_page(s.run_once(), clock.now))
    s.stop()
    # the card data is shown as data; whether it is a problem is the probes' call, and there are none here
    assert all(page.gpu(i)[0] == "ok-row" for i in range(8)), page.words
    assert page.banner[0] == "ok"
    gpus = {cells[0]: cells for table, _, cells in page.rows if table == 1}
    assert "17/18" in gpus["3"]
    assert "2 / 10" in gpus["0"], "the ECC column shows volatile uncorrectable / correctable counts"
    assert "2 / 140 GiB" in gpus[str(IDLE_GPU)]


def test_a_failed_check_shows_on_its_gpu_and_in_the_banner(sim: SimulatedBackend, clock: FakeClock) -> None:
    checks = [
        *(check("nvlink", i, CheckStatus.OK, "18/18 links up") for i in range(8) if i != 3),
        check("nvlink", 3, CheckStatus.FAILED, "NVLink 4 was up and is down"),
        check("clocks", 5, CheckStatus.WARNING, "clock slowdown (hw_slowdown) in 90% of samples"),
        check("ecc", 1, CheckStatus.UNKNOWN, "no sample yet"),
        check("pcie", 2, CheckStatus.UNSUPPORTED, "PCIe link width and generation are not reported"),
    ]
    page = Page(render_status_page(sample(sim, clock), clock.now, checks=lambda: checks, faults=list))
    assert page.gpu(3) == ("bad-row", [("bad", "nvlink: NVLink 4 was up and is down", "")])
    assert page.gpu(5) == ("warn-row", [("warn", "clocks: clock slowdown (hw_slowdown) in 90% of samples", "")])
    assert page.gpu(1)[0] == page.gpu(2)[0] == "ok-row", "unknown and unsupported are not problems"
    assert page.banner == ("bad", "GPU 3 needs attention; GPU 5: warnings")


def test_data_the_probes_did_not_flag_shows_no_problem(sim: SimulatedBackend, clock: FakeClock, tmp_path: Path) -> None:
    """2 GiB held with no process is not a problem until the memory_leak probe says so ([health.memory_leak])."""
    engine = make_engine(tmp_path, clock)
    sources = {"checks": engine.check_states, "faults": engine.active_faults}
    probe = MemoryLeakProbe()
    sim.inject("orphan_memory", IDLE_GPU, {"memory_mib": "2048"})
    sampler = Sampler(sim, CONFIG, clock=clock)
    try:
        snap = sampler.run_once()
        engine.accept_report(probe.evaluate(snap, clock.now))
        text = render_status_page(snap, clock.now, **sources)
        page = Page(text)
        assert page.gpu(IDLE_GPU) == ("ok-row", [("ok", "ok", "")])
        assert page.banner == ("ok", "All 8 GPUs answering, no problems seen")
        samples = probe.settings.orphan_samples
        # the check table says, on hover, what the probe is waiting for
        pending = f"2048 MiB not owned by any listed process in 1 sample(s) in a row; reported after {samples}"
        assert f'title="{pending}"' in text
        for _ in range(samples - 1):
            clock.advance(5)
            snap = sampler.run_once()
            engine.accept_report(probe.evaluate(snap, clock.now))
    finally:
        sampler.stop()
    page = Page(render_status_page(snap, clock.now, **sources))
    text = f"memory_leak: 2048 MiB of GPU memory is used but owned by no listed process (for {samples} samples)"
    assert page.gpu(IDLE_GPU) == ("warn-row", [("warn", text, "")])
    assert page.banner == ("warn", f"GPU {IDLE_GPU}: warnings")


def test_faults_show_on_their_card_by_severity(sim: SimulatedBackend, clock: FakeClock) -> None:
    def happened(code: str, index: int, severity: Severity, action: Action = Action.NONE) -> Fault:
        return fault(code, index, severity, action, f"{code} happened", clock.now - 5)

    snap = sample(sim, clock)
    checks = [check("ecc", i, CheckStatus.OK) for i in range(8)]
    faults = [
        happened("ecc_uncorrectable_volatile", 1, Severity.CRITICAL, Action.RESET_GPU),
        happened("xid_79", 2, Severity.FATAL, Action.REPLACE_NODE),
        happened("persistence_mode_unexpected", 4, Severity.WARNING),
        happened("xid_43", 7, Severity.INFO),
    ]
    page = Page(render_status_page(snap, clock.now, checks=lambda: checks, faults=lambda: faults))
    assert page.gpu(1) == (
        "bad-row",
        [("bad", "fault ecc_uncorrectable_volatile (reset_gpu)", "critical: ecc_uncorrectable_volatile happened")],
    )
    assert page.gpu(2)[0] == "bad-row" and page.gpu(4)[0] == "warn-row"
    assert page.gpu(7)[0] == "ok-row", "an info fault is listed in the fault table only"
    assert "xid_43 7 none xid_43 happened 5 s ago" in page.words
    assert page.banner == ("bad", "GPUs 1, 2 need attention; GPU 4: warnings; 4 active faults")


def test_node_wide_checks_and_faults_go_into_the_banner(sim: SimulatedBackend, clock: FakeClock) -> None:
    checks = [
        check("lost_cards", None, CheckStatus.FAILED, "7 GPUs visible, 8 expected (learned)"),
        check("driver", None, CheckStatus.OK, "driver 580.159.04 loaded and answering"),
    ]
    faults = [fault("gpu_count_low", None, Severity.CRITICAL, Action.REBOOT_NODE, "7 GPUs visible", clock.now)]
    page = Page(render_status_page(sample(sim, clock), clock.now, checks=lambda: checks, faults=lambda: faults))
    assert page.banner == ("bad", "node: lost_cards: 7 GPUs visible, 8 expected (learned); 1 active fault")
    assert all(page.gpu(i)[0] == "ok-row" for i in range(8)), "a node-wide result is no card's problem"
    warn_only = [check("driver", None, CheckStatus.WARNING, "slow driver")]
    assert Page(render_status_page(sample(sim, clock), clock.now, checks=lambda: warn_only, faults=list)).banner == (
        "warn",
        "node: driver: slow driver",
    )


def test_checks_that_have_not_run_yet_are_not_all_clear(sim: SimulatedBackend, clock: FakeClock) -> None:
    page = Page(render_status_page(sample(sim, clock), clock.now, checks=list, faults=list))
    assert page.banner == ("ok", "All 8 GPUs answering; the health checks have not run yet")


def test_a_source_that_raises_is_reported_not_fatal(sim: SimulatedBackend, clock: FakeClock) -> None:
    def broken() -> list[CheckState]:
        raise RuntimeError("engine lock poisoned")

    page = Page(render_status_page(sample(sim, clock), clock.now, checks=broken, faults=list, partitions=list))
    assert "Health checks Not available: reading them failed (RuntimeError: engine lock poisoned)." in page.words
    assert page.banner == ("ok", "All 8 GPUs answering; no health checks in this build")
    assert all(page.gpu(i)[0] == "ok-row" for i in range(8))


def test_lost_gpu_has_no_values_and_says_why(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    sim.inject("gpu_lost", 5)
    snap = s.run_once()
    s.stop()
    page = Page(render_status_page(snap, clock.now))
    klass, pills = page.gpu(5)
    assert klass == "bad-row" and pills[0][1].startswith("not answering (gpu_lost)")
    assert page.banner[0] == "bad" and page.banner[1].startswith("GPU 5 needs attention")
    assert "1 not answering" in page.words and "no current values" in page.words


def test_the_page_shows_faults_checks_and_partitions(sim: SimulatedBackend, clock: FakeClock) -> None:
    snap = sample(sim, clock)
    checks = [
        check("ecc", 0, CheckStatus.OK),
        check("ecc", 3, CheckStatus.FAILED, "2 DBE"),
        check("driver", None, CheckStatus.OK),
    ]
    bus = "GPU has fallen off the bus"
    faults = [fault("xid_79", 3, Severity.FATAL, Action.REPLACE_NODE, bus, clock.now - 42)]
    mig = MigPlacement(profile_id=9, profile_name="3g.71gb", placement_start=4, placement_size=4)
    pod = Owner(OwnerKind.POD, namespace="default", pod="train", container="main")
    tdm = Owner(OwnerKind.LEASE, holder="xpu-device-plugin")
    partitions = [
        PartitionRecord("p-1", 7, "GPU-7", CardMode.MIG, 43, 71 * 1024, pod, State.READY, clock.now, mig=mig),
        PartitionRecord("p-2", 5, "GPU-5", CardMode.TDM, 25, 20480, tdm, State.READY, clock.now),
        PartitionRecord("p-3", 5, "GPU-5", CardMode.TDM, 0, 0, tdm, State.READY, clock.now),
    ]
    page = Page(
        render_status_page(snap, clock.now, checks=lambda: checks, faults=lambda: faults, partitions=lambda: partitions)
    )
    words = page.words
    assert page.banner == ("bad", "GPU 3 needs attention; 1 active fault")
    assert [text for _, text, _ in page.gpu(3)[1]] == ["ecc: 2 DBE", "fault xid_79 (replace_node)"]
    assert "xid_79 3 replace_node GPU has fallen off the bus 42 s ago" in words
    assert "ecc ok failed" in words
    assert "check node GPU 0 GPU 3" in words, "node-wide checks get a column named node"
    assert "p-1 7 mig pod default/train container main MIG 3g.71gb at slice 4" in words
    assert "p-2 5 tdm lease xpu-device-plugin 25%, 20480 MiB" in words
    assert "p-3 5 tdm lease xpu-device-plugin no compute limit" in words


def test_everything_from_the_daemon_is_escaped(sim: SimulatedBackend, clock: FakeClock) -> None:
    evil = '<script>alert("x")</script>'
    checks = [check(evil, 2, CheckStatus.FAILED, evil)]
    faults = [fault(evil, 2, Severity.FATAL, Action.NONE, evil, clock.now)]
    text = render_status_page(
        sample(sim, clock), clock.now, checks=lambda: checks, faults=lambda: faults, hostname=evil
    )
    assert "<script>" not in text
    page = Page(text)
    assert page.external == [] and evil in page.words
    assert page.gpu(2)[1] == [("bad", f"{evil}: {evil}", ""), ("bad", f"fault {evil}", f"fatal: {evil}")]


def test_each_card_shows_its_bus_id_serial_and_pods(sim: SimulatedBackend, clock: FakeClock) -> None:
    """On the simulated node the eight UUIDs share their first 30 characters: the bus id and serial tell them apart,
    and the pods say whom a bad card's trouble reaches."""
    snapshot = sample(sim, clock)
    allocation = Allocation("ml", "trainer-0", "main", "xpu-runtime-kit.io/gpu", "GPU-x", 3, "GPU-x", "")
    attribution = Attribution(0, (), (allocation,), None, 0)
    page = Page(render_status_page(snapshot, attribution=lambda: attribution))
    rows = [cells for table, _, cells in page.rows if table == 1][1:]
    assert len(rows) == 8
    for gpu, cells in zip(snapshot.gpus, rows, strict=True):
        assert gpu.info is not None
        assert gpu.info.pci_bus_id in cells[1] and f"S/N {gpu.info.serial}" in cells[1]
        assert cells[-1] == ("ml/trainer-0" if gpu.index == 3 else "\u2013")
    assert len({cells[1] for cells in rows}) == 8


def test_the_check_table_has_an_xid_row(sim: SimulatedBackend, clock: FakeClock) -> None:
    """A card with an active XID 79 does not read ok on every row of the check table."""
    checks = [check("ecc", i, CheckStatus.OK) for i in range(8)]
    xid = fault("xid_79", 2, Severity.FATAL, Action.REPLACE_NODE, "GPU has fallen off the bus", clock.now, "xid")
    page = Page(render_status_page(sample(sim, clock), clock.now, checks=lambda: checks, faults=lambda: [xid]))
    table = max(t for t, _, _ in page.rows)  # the check table comes last here (no partitions)
    row = next(cells for t, _, cells in page.rows if t == table and cells[0] == "xid")
    assert row[1:] == ["ok", "ok", "failed", "ok", "ok", "ok", "ok", "ok"]


def test_no_sample_yet() -> None:
    assert "No sample yet." in Page(render_status_page(None, 0.0)).words


PILL_BAD = (0xFB, 0xE0, 0xE0)  # .bad in status_page.CSS
ROW_BAD = (0xFF, 0xF5, 0xF5)  # tr.bad-row td


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
    down = "nvlink: NVLink 4 was up and is down"
    # a deadline a busy CI machine cannot miss by accident: only GPU 3 may need attention on this page
    with DaemonProcess(tmp_path, deadline=2.0) as d:
        result = d.xpuctl("simulate", "inject", "nvlink_down", "--gpu", "3", "link=4")
        assert result.returncode == 0, result.stderr
        page_text = ""
        for _ in range(200):  # the next cycles pick it up: the nvlink probe's check first, then its fault
            page_text = d.get("/")[1]
            if down in page_text and "fault nvlink_down" in page_text:
                break
            time.sleep(0.1)
        page = Page(page_text)
        assert page.gpu(3) == (
            "bad-row",
            [("bad", down, ""), ("bad", "fault nvlink_down (reboot_node)", "critical: NVLink 4 was up and is down")],
        ), "the probe's check result and the fault from the health pipeline show on GPU 3"
        assert all(page.gpu(i)[0] == "ok-row" for i in range(8) if i != 3), page.words
        shot = tmp_path / "status.png"
        base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1280,900"]  # fmt: skip
        url = f"http://127.0.0.1:{d.port}/"
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=60, check=False)
        assert dom.returncode == 0, dom.stderr[-2000:]
        words = Page(dom.stdout).words
        assert "GPU 3 needs attention; 1 active fault" in words and down in words
        assert "nvlink_down" in words
        run = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        narrow_shot = tmp_path / "status-900.png"
        narrow = [*base[:-1], "--window-size=900,900", f"--screenshot={narrow_shot}", url]
        run = subprocess.run(narrow, capture_output=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
    narrow_image = png.decode(narrow_shot.read_bytes())
    assert (narrow_image.width, narrow_image.height) == (900, 900)
    # at 900 px the state of GPU 3 is in view: its pills' fill (.bad) inside its tinted row (tr.bad-row)
    assert png.rows_with_both(narrow_image, PILL_BAD, ROW_BAD) >= 10
    data = shot.read_bytes()
    width, height, colours = _png_size_and_colours(data)
    assert (width, height) == (1280, 900)
    assert colours > 20  # a rendered page, not a blank or error screen
    if os.environ.get("XPU_UPDATE_SCREENSHOT"):
        (ROOT / "docs" / "status-page.png").write_bytes(data)
