"""The per-card prologue every probe shares: fresh cards come out with their identity and sample, the others get
their result (unknown, or unsupported when the probe says so first) and are skipped; a card's identity is made
again when its inventory record changes."""

from __future__ import annotations

import dataclasses

from healthd.findings import Action, CheckStatus, Finding, GpuRef, Severity
from healthd.probes.common import ReportBuilder, gpu_ref
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


def test_a_cards_identity_follows_its_inventory_record(h200x8: Node) -> None:
    card = h200x8.tick().gpus[2]
    assert card.info is not None
    ref = gpu_ref(card)
    assert ref == GpuRef(2, card.info.uuid, card.info.pci_bus_id)
    assert gpu_ref(h200x8.tick().gpus[2]) is ref  # the same record: the same reference
    moved = dataclasses.replace(card, info=dataclasses.replace(card.info, pci_bus_id="0000:ff:00.0"))
    assert gpu_ref(moved) == GpuRef(2, card.info.uuid, "0000:ff:00.0")
    assert gpu_ref(dataclasses.replace(card, info=None)) == GpuRef(2, "", "")
    assert gpu_ref(card) == ref


def test_a_card_without_findings_is_ok_with_its_detail_and_one_with_them_takes_the_worst() -> None:
    ref = GpuRef(0, "GPU-0", "0000:00:00.0")
    report = ReportBuilder("demo")
    report.gpu_done(ref, [], "all fine")
    warn = Finding("demo", "x", Severity.WARNING, Action.NONE, "slow", ref)
    report.gpu_done(ref, [warn, dataclasses.replace(warn, code="y", message="hot")], "all fine")
    built = report.build()
    assert [(r.status, r.detail) for r in built.results] == [
        (CheckStatus.OK, "all fine"),
        (CheckStatus.WARNING, "slow; hot"),
    ]
    assert [f.code for f in built.findings] == ["x", "y"]
