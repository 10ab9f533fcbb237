from __future__ import annotations

from pathlib import Path

from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, ProbeReport
from healthd.probes import HealthSettings, ProbeHost, default_probes
from healthd.probes.ecc import EccProbe
from healthd.probes.runner import ProbeRunner
from tests.support.probe_node import Node


class Sink:
    def __init__(self) -> None:
        self.reports: list[ProbeReport] = []
        self.events: list[Finding] = []

    def report(self, report: ProbeReport) -> None:
        self.reports.append(report)

    def event(self, finding: Finding) -> None:
        self.events.append(finding)


class Broken:
    name = "broken"

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        raise RuntimeError("bug in a probe")


def test_a_probe_that_raises_is_unknown_and_the_rest_still_run(h200x8: Node) -> None:
    sink = Sink()
    runner = ProbeRunner([Broken(), EccProbe()], sink, h200x8.clock)
    h200x8.inject("ecc", 0, uncorrected=1)
    reports = runner.on_snapshot(h200x8.tick())
    assert [r.check for r in sink.reports] == ["broken", "ecc"]
    broken = reports[0].results[0]
    assert (str(broken.status), broken.detail) == ("unknown", "probe failed: RuntimeError: bug in a probe")
    assert reports[1].findings[0].code == "ecc_uncorrectable_volatile"
    assert runner.failures["broken"] == 1
    assert set(runner.last_seconds) == {"broken", "ecc"}


def test_a_failing_sink_does_not_stop_the_runner(h200x8: Node) -> None:
    class BadSink(Sink):
        def report(self, report: ProbeReport) -> None:
            super().report(report)
            raise OSError("journal full")

    sink = BadSink()
    ProbeRunner([EccProbe(), Broken()], sink, h200x8.clock).on_snapshot(h200x8.tick())
    assert len(sink.reports) == 2


def test_probe_names_are_unique(tmp_path: Path) -> None:
    probes = default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path))
    assert len({p.name for p in probes}) == len(probes) == 8


def test_default_probes_on_a_healthy_single_card_report_nothing(h200x1: Node, tmp_path: Path) -> None:
    sink = Sink()
    runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), sink, h200x1.clock)
    h200x1.sampler.subscribe(runner.on_snapshot)
    for _ in range(5):
        h200x1.tick()
    assert all(r.findings == () for r in sink.reports)
    nvlink = [r for r in sink.reports if r.check == "nvlink"]
    assert {str(res.status) for r in nvlink for res in r.results} == {"unsupported"}


def test_default_probes_over_a_faulty_node(h200x8: Node, tmp_path: Path) -> None:
    sink = Sink()
    runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), sink, h200x8.clock)
    h200x8.sampler.subscribe(runner.on_snapshot)
    h200x8.tick()
    h200x8.inject("remap_failure", 1)
    h200x8.inject("nvlink_down", 2, link=4)
    h200x8.inject("gpu_lost", 3)
    h200x8.inject("persistence_off", 4)
    sink.reports.clear()
    h200x8.tick()
    found = {(f.check, f.code, f.gpu.index if f.gpu else None, f.action) for r in sink.reports for f in r.findings}
    assert found == {
        ("ecc", "ecc_row_remap_failure", 1, Action.REPLACE_NODE),
        ("nvlink", "nvlink_down", 2, Action.REBOOT_NODE),
        ("driver", "gpu_lost", 3, Action.REPLACE_NODE),
        ("configuration", "persistence_mode_unexpected", 4, Action.NONE),
    }
