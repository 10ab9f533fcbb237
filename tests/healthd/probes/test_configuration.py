from __future__ import annotations

from healthd.findings import Action, Severity
from healthd.probes.configuration import ConfigurationProbe, Settings
from tests.support.probe_node import Node, codes, only, status


def test_stock_node_matches_expectations(h200x8: Node) -> None:
    report = ConfigurationProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert {str(r.status) for r in report.results} == {"ok"}


def test_unexpected_compute_mode(h200x8: Node) -> None:
    h200x8.inject("compute_mode", 2, mode="exclusive_process")
    h200x8.inject("compute_mode", 3, mode="prohibited")
    report = ConfigurationProbe().evaluate(h200x8.tick(), h200x8.clock())
    by_gpu = {f.gpu.index: f for f in report.findings if f.gpu}
    assert set(by_gpu) == {2, 3}
    assert (by_gpu[2].code, by_gpu[2].severity, by_gpu[2].action) == (
        "compute_mode_unexpected",
        Severity.WARNING,
        Action.NONE,
    )
    assert by_gpu[3].severity is Severity.CRITICAL
    assert by_gpu[3].evidence["compute_mode"] == "prohibited"


def test_expected_compute_mode_is_configurable(h200x8: Node) -> None:
    h200x8.inject("compute_mode", 2, mode="exclusive_process")
    probe = ConfigurationProbe(Settings(compute_mode="exclusive_process"))
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    assert codes(report, 2) == set()
    assert codes(report, 0) == {"compute_mode_unexpected"}
    assert codes(ConfigurationProbe(Settings(compute_mode="any")).evaluate(h200x8.tick(), 0)) == set()


def test_persistence_off_is_a_warning(h200x8: Node) -> None:
    h200x8.inject("persistence_off", 1)
    f = only(ConfigurationProbe().evaluate(h200x8.tick(), h200x8.clock()), "persistence_mode_unexpected")
    assert (f.gpu.index if f.gpu else None, f.severity, f.action) == (1, Severity.WARNING, Action.NONE)


def test_pending_mig_and_ecc_changes_reported_after_grace(h200x8: Node) -> None:
    probe = ConfigurationProbe(Settings(pending_grace_seconds=60))
    h200x8.inject("mig_pending", 0)
    h200x8.inject("ecc_pending", 1)
    assert probe.evaluate(h200x8.tick(), h200x8.clock()).findings == ()  # the partitioner may be mid-switch
    report = probe.evaluate(h200x8.tick(60), h200x8.clock())
    mig = only(report, "mig_mode_pending")
    ecc = only(report, "ecc_mode_pending")
    assert (mig.gpu.index if mig.gpu else None, ecc.gpu.index if ecc.gpu else None) == (0, 1)
    assert mig.action is Action.RESET_GPU
    assert mig.severity is Severity.WARNING
    assert status(report, 0) == "warning"


def test_stale_gpu_is_unknown(h200x8: Node) -> None:
    h200x8.inject("compute_mode", 4, mode="prohibited")
    h200x8.inject("gpu_lost", 4)
    report = ConfigurationProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert status(report, 4) == "unknown"
    assert codes(report) == set()
