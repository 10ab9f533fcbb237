from __future__ import annotations

import dataclasses

from exporter.backends.types import UNSUPPORTED
from healthd.findings import Action, Severity
from healthd.probes.ecc import EccProbe, Settings
from tests.support.probe_node import Node, codes, only, status


def test_healthy_node_has_no_findings_and_every_gpu_ok(h200x8: Node) -> None:
    report = EccProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert {str(r.status) for r in report.results} == {"ok"}
    assert len(report.results) == 8


def test_uncorrectable_error_needs_gpu_reset_and_stays_reported(h200x8: Node) -> None:
    probe = EccProbe()
    h200x8.inject("ecc", 3, uncorrected=2)
    for _ in range(3):  # a condition: re-reported on every evaluation while it lasts
        report = probe.evaluate(h200x8.tick(), h200x8.clock())
        f = only(report, "ecc_uncorrectable_volatile")
        assert (f.gpu.index if f.gpu else None, f.severity, f.action) == (3, Severity.CRITICAL, Action.RESET_GPU)
        assert f.evidence["uncorrected_volatile"] == "2"
        assert status(report, 3) == "failed"
        assert status(report, 2) == "ok"


def test_remap_pending_needs_reset_and_failure_needs_replacement(h200x8: Node) -> None:
    h200x8.inject("remap_pending", 1)
    h200x8.inject("remap_failure", 2)
    report = EccProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert codes(report, 1) == {"ecc_row_remap_pending"}
    assert only(report, "ecc_row_remap_pending").action is Action.RESET_GPU
    assert codes(report, 2) == {"ecc_row_remap_failure"}
    failure = only(report, "ecc_row_remap_failure")
    assert (failure.severity, failure.action) == (Severity.FATAL, Action.REPLACE_NODE)


def test_uncorrectable_remap_count_threshold(h200x8: Node) -> None:
    probe = EccProbe(Settings(uncorrectable_remap_warn=3))
    h200x8.inject("remap_pending", 0)
    h200x8.inject("remap_pending", 0)
    assert "ecc_uncorrectable_remaps" not in codes(probe.evaluate(h200x8.tick(), h200x8.clock()))
    h200x8.inject("remap_pending", 0)
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "ecc_uncorrectable_remaps")
    assert (f.severity, f.action, f.evidence["uncorrectable_remaps"]) == (Severity.WARNING, Action.NONE, "3")


def test_correctable_rate_warns_only_above_threshold(h200x8: Node) -> None:
    probe = EccProbe(Settings(correctable_rate_per_hour=100))
    probe.evaluate(h200x8.tick(), h200x8.clock())
    # 10 corrected errors every 5 minutes = 120/h, after 10 minutes of history
    found = set()
    for _ in range(4):
        h200x8.inject("ecc", 0, corrected=10)
        report = probe.evaluate(h200x8.tick(300), h200x8.clock())
        found |= codes(report, 0)
    assert "ecc_correctable_rate" in found
    f = only(report, "ecc_correctable_rate")
    assert (f.severity, f.action) == (Severity.WARNING, Action.NONE)
    assert float(f.evidence["rate_per_hour"]) >= 100


def test_short_burst_of_correctable_errors_is_not_extrapolated(h200x8: Node) -> None:
    probe = EccProbe(Settings(correctable_rate_per_hour=100))
    probe.evaluate(h200x8.tick(), h200x8.clock())
    h200x8.inject("ecc", 0, corrected=12)  # 12 in 5 s would be 8640/h if extrapolated; over 10 min it is 72/h
    assert "ecc_correctable_rate" not in codes(probe.evaluate(h200x8.tick(), h200x8.clock()))


def test_slow_correctable_errors_do_not_warn(h200x8: Node) -> None:
    probe = EccProbe()
    probe.evaluate(h200x8.tick(), h200x8.clock())
    for _ in range(12):
        h200x8.inject("ecc", 0, corrected=1)  # 12/h
        assert "ecc_correctable_rate" not in codes(probe.evaluate(h200x8.tick(300), h200x8.clock()))


def test_stale_gpu_is_unknown_not_failed(h200x8: Node) -> None:
    probe = EccProbe()
    h200x8.inject("ecc", 4, uncorrected=1)
    h200x8.inject("gpu_lost", 4)
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    assert status(report, 4) == "unknown"
    assert codes(report, 4) == set()


def test_card_without_ecc_or_remapping_is_unsupported(h200x1: Node) -> None:
    snap = h200x1.tick()
    g = snap.gpus[0]
    assert g.sample is not None
    sample = dataclasses.replace(
        g.sample, ecc=dataclasses.replace(g.sample.ecc, enabled_current=False), remapped_rows=UNSUPPORTED
    )
    snap = dataclasses.replace(snap, gpus=(dataclasses.replace(g, sample=sample),))
    report = EccProbe().evaluate(snap, h200x1.clock())
    assert status(report, 0) == "unsupported"
    assert report.findings == ()
