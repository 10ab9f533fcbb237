"""Clock slowdown and PCIe link warnings. The simulator cannot inject these, so the tests take a real Snapshot
from the sampler and change the one reading under test with dataclasses.replace."""

from __future__ import annotations

import dataclasses

from exporter.backends.types import ClockEventReason
from exporter.snapshot import Snapshot
from healthd.findings import Action, Severity
from healthd.probes.pcie import PcieProbe
from healthd.probes.throttle import ThrottleProbe
from tests.support.probe_node import Node, codes, only, status


def _with(snap: Snapshot, gpu: int, **sample_changes: object) -> Snapshot:
    gpus = list(snap.gpus)
    g = gpus[gpu]
    assert g.sample is not None
    gpus[gpu] = dataclasses.replace(g, sample=dataclasses.replace(g.sample, **sample_changes))  # type: ignore[arg-type]
    return dataclasses.replace(snap, gpus=tuple(gpus))


def test_sustained_thermal_slowdown_warns(h200x8: Node) -> None:
    probe = ThrottleProbe()
    report = None
    for i in range(10):
        throttled = i % 5 != 0  # 80% of samples
        snap = h200x8.tick(60)
        snap = _with(snap, 2, clock_event_reasons=ClockEventReason.HW_THERMAL_SLOWDOWN) if throttled else snap
        report = probe.evaluate(snap, h200x8.clock())
    assert report is not None
    f = only(report, "clocks_hw_slowdown")
    assert (f.gpu.index if f.gpu else None, f.severity, f.action) == (2, Severity.WARNING, Action.NONE)
    assert f.evidence["reasons"] == "hw_thermal_slowdown"  # the label xpu_gpu_clock_event_active exports


def test_occasional_slowdown_and_software_power_cap_do_not_warn(h200x8: Node) -> None:
    probe = ThrottleProbe()
    for i in range(10):
        snap = h200x8.tick(60)
        reasons = ClockEventReason.HW_THERMAL_SLOWDOWN if i % 3 == 0 else ClockEventReason.SW_POWER_CAP  # 40% HW
        snap = _with(snap, 2, clock_event_reasons=reasons)
        report = probe.evaluate(snap, h200x8.clock())
        assert codes(report) == set()


def test_narrow_pcie_link_warns_after_consecutive_samples(h200x8: Node) -> None:
    probe = PcieProbe()
    for i in range(3):
        report = probe.evaluate(_with(h200x8.tick(), 1, pcie_width=8), h200x8.clock())
        assert (codes(report, 1) == {"pcie_width_degraded"}) == (i == 2)
    f = only(report, "pcie_width_degraded")
    assert f.message == "PCIe link width is 8x, the card supports 16x"
    assert status(report, 1) == "warning"


def test_low_pcie_generation_on_idle_card_is_normal(h200x1: Node) -> None:
    probe = PcieProbe()
    for _ in range(5):  # the h200x1 capture is idle
        assert codes(probe.evaluate(_with(h200x1.tick(), 0, pcie_generation=1), h200x1.clock())) == set()


def test_low_pcie_generation_on_busy_card_warns(h200x8: Node) -> None:
    probe = PcieProbe()
    for _ in range(3):  # GPU 0 runs the training job in the scenario
        report = probe.evaluate(_with(h200x8.tick(), 0, pcie_generation=3, gpu_utilization_ratio=0.9), 0)
    assert only(report, "pcie_generation_degraded").evidence["current"] == "3"


def test_healthy_links(h200x8: Node) -> None:
    report = PcieProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert {str(r.status) for r in report.results} == {"ok"}
