"""A new probe is one module plus one registry line: its settings table, its runs, its check-status series and its
faults follow from ``PROBES`` alone (docs/architecture.md, "Probes")."""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.core import Metric

import healthd.probes
from exporter.settings import option
from exporter.snapshot import Snapshot
from healthd.daemon.config import ConfigError, parse_config
from healthd.faults.metrics import FaultMetricsCollector
from healthd.findings import Action, Finding, ProbeReport, Severity
from healthd.probes import PROBES, ProbeHost, default_probes
from healthd.probes.common import ReportBuilder, gpu_ref
from healthd.probes.runner import ProbeRunner
from tests.support.faults_helpers import SETTINGS, make_engine
from tests.support.probe_node import Node


@dataclass(frozen=True, slots=True)
class HotSettings:
    max_celsius: float = option(85.0, min=0, max=150)


class HotProbe:
    """A card above ``max_celsius`` is a warning: the smallest probe that has a setting and a finding."""

    name = "hot"

    def __init__(self, max_celsius: float) -> None:
        self.max_celsius = max_celsius

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(self.name)
        for g in snapshot.gpus:
            if not g.fresh or g.sample is None or g.info is None:
                report.stale(g)
                continue
            temp = g.sample.temperature_gpu_celsius
            hot = isinstance(temp, float | int) and temp > self.max_celsius
            findings = (
                [Finding(self.name, "too_hot", Severity.WARNING, Action.NONE, f"{temp} °C", gpu=gpu_ref(g))]
                if hot
                else []
            )
            report.gpu_done(gpu_ref(g), findings, "cool")
        return report.build()


def _build(settings: HotSettings, host: ProbeHost) -> HotProbe:
    return HotProbe(settings.max_celsius)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The probe module as a file would define it, added to the registry with one line."""
    module = types.ModuleType("hot")
    module.SECTION = "hot"  # type: ignore[attr-defined]
    module.Settings = HotSettings  # type: ignore[attr-defined]
    module.build = _build  # type: ignore[attr-defined]
    monkeypatch.setattr(healthd.probes, "PROBES", (*PROBES, module))
    return module


class Sink:
    def __init__(self, engine: object) -> None:
        self.engine = engine

    def report(self, report: ProbeReport) -> None:
        self.engine.report(report)  # type: ignore[attr-defined]

    def event(self, finding: Finding) -> None:
        self.engine.event(finding)  # type: ignore[attr-defined]


def _samples(metrics: list[Metric], name: str) -> list[dict[str, str]]:
    return [s.labels for m in metrics if m.name == name for s in m.samples if s.value == 1.0]


@pytest.mark.usefixtures("registered")
def test_its_table_is_read_with_bounds_and_named_errors() -> None:
    assert parse_config({}).health.probe("hot").max_celsius == 85.0
    assert parse_config({"health": {"hot": {"max_celsius": 60}}}).health.probe("hot").max_celsius == 60
    with pytest.raises(ConfigError, match=r"health\.hot\.max_celsius"):
        parse_config({"health": {"hot": {"max_celsius": 400}}})
    with pytest.raises(ConfigError, match=r"health\.hot"):
        parse_config({"health": {"hot": {"max_celsus": 60}}})


@pytest.mark.usefixtures("registered")
def test_it_runs_and_its_status_and_faults_are_exported(h200x8: Node, tmp_path: Path) -> None:
    settings = parse_config({"health": {"hot": {"max_celsius": 0}}}).health
    probes = default_probes(settings, ProbeHost(state_dir=tmp_path))
    assert [p.name for p in probes][-1] == "hot"
    engine = make_engine(tmp_path, h200x8.clock)  # type: ignore[arg-type]
    runner = ProbeRunner(probes, Sink(engine), h200x8.clock)
    for _ in range(SETTINGS.open_after_evaluations):
        runner.on_snapshot(h200x8.tick())
    metrics = list(FaultMetricsCollector(engine).collect(h200x8.tick(), h200x8.clock()))
    hot = [s for s in _samples(metrics, "xpu_health_check_status") if s["check"] == "hot"]
    assert {s["gpu"] for s in hot} == {str(i) for i in range(8)}
    assert {s["status"] for s in hot} == {"warning"}
    assert {s["gpu"] for s in _samples(metrics, "xpu_faults_active") if s["code"] == "too_hot"} == {
        str(i) for i in range(8)
    }
