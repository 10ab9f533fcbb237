"""The NVLink probe on simulated nodes, and over any run of link readings hypothesis finds: the reports of the
probe that evaluates every link in full (its shortcut for a link as before changes nothing)."""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.backends.types import UNSUPPORTED, LinkState, NvLinkSample, Unsupported
from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, ProbeReport, Severity
from healthd.probes.common import ReportBuilder, evidence
from healthd.probes.nvlink import NvLinkProbe, Settings, _LinkState
from tests.support.clock import FakeClock
from tests.support.probe_node import Node, codes, only, status


def test_card_without_nvlink_is_unsupported_never_a_fault(h200x1: Node) -> None:
    probe = NvLinkProbe()
    for _ in range(3):
        report = probe.evaluate(h200x1.tick(), h200x1.clock())
        assert report.findings == ()
        assert status(report, 0) == "unsupported"


def test_healthy_hgx_node(h200x8: Node) -> None:
    report = NvLinkProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert all(str(r.status) == "ok" for r in report.results)
    assert report.results[0].detail == "18/18 links up"


def test_link_that_was_up_and_went_down(h200x8: Node) -> None:
    probe = NvLinkProbe()
    probe.evaluate(h200x8.tick(), h200x8.clock())
    h200x8.inject("nvlink_down", 5, link=7)
    for _ in range(2):
        report = probe.evaluate(h200x8.tick(), h200x8.clock())
        f = only(report, "nvlink_down")
        assert (f.gpu.index if f.gpu else None, f.evidence["link"], f.severity) == (5, "7", Severity.CRITICAL)
        assert f.action is Action.REBOOT_NODE
    h200x8.backend.clear(5)
    assert probe.evaluate(h200x8.tick(), h200x8.clock()).findings == ()


def test_two_links_down_on_one_card_are_one_condition(h200x8: Node) -> None:
    probe = NvLinkProbe()
    probe.evaluate(h200x8.tick(), h200x8.clock())
    h200x8.inject("nvlink_down", 5, link=3)
    h200x8.inject("nvlink_down", 5, link=7)
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "nvlink_down")
    assert f.evidence["link"] == "3,7"
    assert f.message == "NVLink 3 was up and is down; NVLink 7 was up and is down"


def test_link_down_from_the_start_is_not_a_fault(h200x8: Node) -> None:
    h200x8.inject("nvlink_down", 2, link=0)
    probe = NvLinkProbe()
    for _ in range(2):
        assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()


def test_card_with_no_link_ever_up_is_a_warning(h200x8: Node) -> None:
    for link in range(18):
        h200x8.inject("nvlink_down", 1, link=link)
    report = NvLinkProbe().evaluate(h200x8.tick(), h200x8.clock())
    f = only(report, "nvlink_none_active")
    assert (f.severity, f.action) == (Severity.WARNING, Action.NONE)


def test_replay_and_recovery_increments_are_held_then_clear(h200x8: Node) -> None:
    probe = NvLinkProbe(Settings(error_hold_seconds=60))
    probe.evaluate(h200x8.tick(), h200x8.clock())
    h200x8.inject("nvlink_errors", 0, link=3, replay=2, recovery=1)
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    assert codes(report, 0) == {"nvlink_replay_errors", "nvlink_recovery_errors"}
    assert only(report, "nvlink_replay_errors").severity is Severity.WARNING
    rec = only(report, "nvlink_recovery_errors")
    assert (rec.severity, rec.action, rec.evidence["increment"]) == (Severity.CRITICAL, Action.RESET_GPU, "1")
    assert codes(probe.evaluate(h200x8.tick(30), h200x8.clock()), 0) == {
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
    }
    assert codes(probe.evaluate(h200x8.tick(60), h200x8.clock()), 0) == set()


def test_crc_rate_threshold(h200x8: Node) -> None:
    probe = NvLinkProbe()
    probe.evaluate(h200x8.tick(), h200x8.clock())
    h200x8.inject("nvlink_errors", 6, link=1, crc=400)  # 80/s over 5 s: below 100/s
    assert codes(probe.evaluate(h200x8.tick(), h200x8.clock())) == set()
    h200x8.inject("nvlink_errors", 6, link=1, crc=600)  # 120/s
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "nvlink_crc_rate")
    assert f.gpu is not None
    assert f.gpu.index == 6
    assert f.severity is Severity.CRITICAL


def test_errors_before_the_first_sample_are_not_increments(h200x8: Node) -> None:
    h200x8.inject("nvlink_errors", 0, link=0, replay=50, recovery=5, crc=10_000)
    probe = NvLinkProbe()
    assert probe.evaluate(h200x8.tick(), h200x8.clock()).findings == ()
    assert probe.evaluate(h200x8.tick(), h200x8.clock()).findings == ()


class _EveryLinkInFull(NvLinkProbe):
    """The probe without its shortcut: every link through ``_link``, every cycle."""

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder("nvlink")
        for g, ref, sample in report.fresh_cards(snapshot):
            links = sample.nvlinks
            assert not isinstance(links, Unsupported) and links
            findings: list[Finding] = []
            never_up = up = 0
            for link in links:
                state = self._links.setdefault((g.uuid, link.link), _LinkState())
                findings += self._link(ref, link, state, now)
                never_up += not state.seen_up
                up += link.state is LinkState.UP
            if never_up == len(links):
                findings.append(
                    Finding(
                        "nvlink",
                        "nvlink_none_active",
                        Severity.WARNING,
                        Action.NONE,
                        f"none of the {len(links)} NVLinks has been up since the daemon started",
                        ref,
                        evidence(links=len(links)),
                    )
                )
            report.gpu_done(ref, findings, f"{up}/{len(links)} links up")
        return report.build()


# one link in one cycle: up or down, and what each counter (crc, replay, recovery) does: stays, moves, unreported
# (moves are rare: a link that ever had an increment is always evaluated in full, so most runs must have few)
COUNTER = st.sampled_from([0] * 12 + [1, 500, None])
LINK = st.tuples(st.sampled_from([True, True, True, False]), COUNTER, COUNTER, COUNTER)
CYCLE = st.tuples(st.sampled_from([0.0, 5.0, 5.0, 5.0, 400.0]), st.lists(LINK, min_size=3, max_size=3))


@functools.cache
def _one_card() -> Snapshot:
    """A Snapshot of one simulated card, given three links below."""
    node = Node("h200x1", FakeClock())
    try:
        base = node.tick()
    finally:
        node.close()
    card = base.gpus[0]
    assert card.info is not None
    return dataclasses.replace(
        base, gpus=(dataclasses.replace(card, info=dataclasses.replace(card.info, nvlink_count=3)),)
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(CYCLE, min_size=1, max_size=40))
def test_reports_are_those_of_every_link_evaluated_in_full(
    cycles: list[tuple[float, list[tuple[bool, int | None, int | None, int | None]]]],
) -> None:
    base = _one_card()
    card = base.gpus[0]
    assert card.sample is not None
    probe, full = NvLinkProbe(Settings(error_hold_seconds=300)), _EveryLinkInFull(Settings(error_hold_seconds=300))
    totals = [[0, 0, 0] for _ in range(3)]
    now = 1000.0
    for dt, links in cycles:
        now += dt
        samples = []
        for i, (is_up, *moves) in enumerate(links):
            counters: list[int | Unsupported] = []
            for k, move in enumerate(moves):
                if move is not None:
                    totals[i][k] += move
                counters.append(UNSUPPORTED if move is None else totals[i][k])
            crc, replay, recovery = counters
            state = LinkState.UP if is_up else LinkState.DOWN
            samples.append(NvLinkSample(i, state, crc, replay, recovery, UNSUPPORTED, UNSUPPORTED))
        sample = dataclasses.replace(card.sample, nvlinks=tuple(samples))
        snapshot = dataclasses.replace(base, gpus=(dataclasses.replace(card, sample=sample),))
        assert probe.evaluate(snapshot, now) == full.evaluate(snapshot, now)
