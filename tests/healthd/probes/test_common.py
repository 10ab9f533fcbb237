"""The per-card prologue every probe shares: fresh cards come out with their identity and sample, the others get
their result (unknown, or unsupported when the probe says so first) and are skipped."""

from __future__ import annotations

from healthd.findings import CheckStatus
from healthd.probes.common import ReportBuilder
from tests.support.probe_node import Node


def test_stale_cards_are_unknown_and_skipped(h200x8: Node) -> None:
    h200x8.inject("hang", 3, call="sample")
    snapshot = h200x8.tick()
    report = ReportBuilder("demo")
    seen = [(g.index, ref.index, sample is g.sample) for g, ref, sample in report.fresh_cards(snapshot)]
    assert seen == [(i, i, True) for i in range(8) if i != 3]
    (result,) = report.build().results
    assert (result.gpu.index if result.gpu else None, result.status) == (3, CheckStatus.UNKNOWN)
    assert "timeout" in result.detail


def test_unsupported_is_asked_first(h200x8: Node) -> None:
    h200x8.inject("hang", 3, call="sample")
    snapshot = h200x8.tick()
    report = ReportBuilder("demo")
    odd = [g.index for g, _, _ in report.fresh_cards(snapshot, lambda g: "odd" if g.index % 2 else None)]
    assert odd == [0, 2, 4, 6]
    statuses = {r.gpu.index: r.status for r in report.build().results if r.gpu is not None}
    assert statuses == {
        1: CheckStatus.UNSUPPORTED,
        3: CheckStatus.UNSUPPORTED,
        5: CheckStatus.UNSUPPORTED,
        7: CheckStatus.UNSUPPORTED,
    }
