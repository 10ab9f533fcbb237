from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from healthd.findings import Action, Severity
from healthd.probes.driver import DriverProbe, Settings, read_module_version, scan_dstate
from tests.support.clock import FakeClock
from tests.support.probe_node import INTERVAL, Node, codes, only, status

OPEN_MODULE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Oct 23 21:01:22 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu)\n"
)
PROPRIETARY_MODULE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"


def _proc(tmp_path: Path, module: str | None = OPEN_MODULE) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    if module is not None:
        (root / "driver" / "nvidia").mkdir(parents=True)
        (root / "driver" / "nvidia" / "version").write_text(module)
    return root


def _process(root: Path, pid: int, comm: str, state: str, *, wchan: str = "0", stack: str | None = None) -> None:
    d = root / str(pid)
    d.mkdir()
    fields = " ".join(["1"] * 17 + ["777"] + ["0"] * 30)  # field 22 (start time) = 777
    (d / "stat").write_text(f"{pid} ({comm}) {state} {fields}\n")
    (d / "wchan").write_text(wchan)
    if stack is not None:
        (d / "stack").write_text(stack)


@pytest.fixture
def node_hang(clock: FakeClock) -> Iterator[Node]:
    node = Node("h200x8", clock, deadline=0.2)
    yield node
    node.close()


def test_module_version_formats() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = _proc(Path(d), OPEN_MODULE)
        assert read_module_version(root) == "580.159.04"
        (root / "driver/nvidia/version").write_text(PROPRIETARY_MODULE)
        assert read_module_version(root) == "535.129.03"
        (root / "driver/nvidia/version").write_text("garbage")
        assert read_module_version(root) is None
        assert read_module_version(Path(d) / "nowhere") is None


def test_healthy_node(h200x8: Node, tmp_path: Path) -> None:
    probe = DriverProbe(proc_root=_proc(tmp_path))
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    node = next(r for r in report.results if r.gpu is None)
    assert str(node.status) == "ok"
    assert "580.159.04" in node.detail


def test_kernel_module_differs_from_library(h200x8: Node, tmp_path: Path) -> None:
    probe = DriverProbe(proc_root=_proc(tmp_path, PROPRIETARY_MODULE))
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "driver_version_mismatch")
    assert f.gpu is None
    assert (f.severity, f.action) == (Severity.CRITICAL, Action.REBOOT_NODE)
    assert dict(f.evidence) == {"kernel_module": "535.129.03", "library": "580.159.04"}


def test_nvml_init_version_mismatch(clock: FakeClock) -> None:
    backend = SimulatedBackend(load_scenario("h200x1"), clock=clock, version_mismatch=True)
    sampler = Sampler(backend, SamplerSettings(5.0, 1.0), clock=clock)
    try:
        snap = sampler.run_once()
        assert not snap.backend_up
        report = DriverProbe().evaluate(snap, clock())
        f = only(report, "driver_version_mismatch")
        assert f.action is Action.REBOOT_NODE
        assert "580.142.00" in f.message
        assert str(report.results[0].status) == "failed"
    finally:
        sampler.stop(1.0)


def test_gpu_lost_is_fatal_even_though_the_sample_is_stale(h200x8: Node) -> None:
    probe = DriverProbe()
    h200x8.inject("gpu_lost", 6)
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    f = only(report, "gpu_lost")
    assert (f.gpu.index if f.gpu else None, f.severity, f.action) == (6, Severity.FATAL, Action.REPLACE_NODE)
    assert status(report, 6) == "failed"
    assert status(report, 5) == "ok"


def test_hung_driver_call_warns_then_escalates(node_hang: Node) -> None:
    probe = DriverProbe(Settings(hang_after_seconds=60))
    node_hang.tick()
    node_hang.inject("hang", 2, call="sample")
    first = only(probe.evaluate(node_hang.tick(), node_hang.clock()), "driver_call_timeout")
    assert (first.severity, first.action) == (Severity.WARNING, Action.NONE)
    later = only(probe.evaluate(node_hang.tick(60), node_hang.clock()), "driver_call_timeout")
    assert (later.severity, later.action) == (Severity.CRITICAL, Action.REBOOT_NODE)
    assert later.gpu is not None
    assert later.gpu.index == 2
    node_hang.backend.clear(2)
    node_hang.tick()
    assert codes(probe.evaluate(node_hang.tick(), node_hang.clock())) == set()


def test_a_hang_message_names_when_the_call_went_in_and_stays_true(node_hang: Node) -> None:
    """The fault keeps its message while it is open and is shown long after: a count of seconds frozen at one
    report would contradict the cells next to it, a start time does not."""
    probe = DriverProbe(Settings(hang_after_seconds=60))
    node_hang.tick()
    went_in = node_hang.clock()
    node_hang.inject("hang", 2, call="sample")
    first = only(probe.evaluate(node_hang.tick(), node_hang.clock()), "driver_call_timeout")
    later = only(probe.evaluate(node_hang.tick(60), node_hang.clock()), "driver_call_timeout")
    assert first.message == later.message
    assert first.message.startswith("driver call sample has not returned since ")
    stamp = first.message.removeprefix("driver call sample has not returned since ").split(";")[0]
    since = calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%SZ"))
    assert went_in - 1 <= since <= went_in + INTERVAL + 1, (stamp, went_in)
    assert "stuck for" not in first.message


def test_recovery_action_field(h200x8: Node) -> None:
    h200x8.inject("remap_pending", 4)  # the simulator sets the recovery action to GPU reset with it
    f = only(DriverProbe().evaluate(h200x8.tick(), 0), "recovery_action_gpu_reset")
    assert (f.gpu.index if f.gpu else None, f.action) == (4, Action.RESET_GPU)


def test_process_stuck_in_the_driver(h200x8: Node, tmp_path: Path) -> None:
    root = _proc(tmp_path)
    _process(root, 100, "python3", "D", wchan="0", stack="[<0>] os_acquire_mutex+0x1a/0x40 [nvidia]\n")
    _process(root, 101, "nvidia-smi", "D", wchan="nv_wait_open_complete")
    _process(root, 102, "jbd2/sda1-8", "D", wchan="jbd2_journal_commit_transaction")  # D state, not the driver
    _process(root, 103, "python3", "S", wchan="os_acquire_mutex")  # sleeping normally
    assert {p.pid for p in scan_dstate(root)} == {100, 101}
    probe = DriverProbe(Settings(dstate_after_seconds=120), proc_root=root)
    assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()  # not yet held long enough
    report = probe.evaluate(h200x8.tick(120), h200x8.clock())
    stuck = only(report, "driver_process_stuck")  # one node-wide condition naming both processes
    assert stuck.evidence["pid"] == "100,101"
    assert stuck.action is Action.REBOOT_NODE
    assert stuck.gpu is None
    assert "python3" in stuck.message
    assert "nvidia-smi" in stuck.message


def test_dstate_scan_survives_odd_process_names(tmp_path: Path) -> None:
    root = _proc(tmp_path)
    _process(root, 200, "a) D (b", "S")  # a comm with parentheses and a fake state inside
    _process(root, 201, "nvidia-persistenced", "D")
    (root / "202").mkdir()  # a process that exited between listdir and read
    assert [(p.pid, p.comm) for p in scan_dstate(root)] == [(201, "nvidia-persistenced")]
