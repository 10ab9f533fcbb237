"""docs/metrics.md's cardinality budget against what the simulated daemon really exports: the series of the
``h200x8`` and ``h200x8-busy`` nodes in all, and of one card, counted on /metrics once every family is there, must
be the table's figures within 1 % (so the budget cannot drift from the exposition again)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

pytestmark = pytest.mark.e2e

DOC = REPO / "docs" / "metrics.md"
TOLERANCE = 0.01
# the families that come last: topology once sampling runs, pods once kubelet was read, profiling from cycle two
COMPLETE = ("xpu_topology_up 1.0", "xpu_pod_gpu_allocated{", "xpu_gpu_sm_active_ratio{")


def _budget_row(label: str) -> int:
    """The series column of the row whose first cell starts with ``label`` (a number written with commas)."""
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith(label):
            return int(cells[1].replace(",", ""))
    raise AssertionError(f"docs/metrics.md: no cardinality row starting with {label!r}")


def _series(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.fixture(scope="module", params=["h200x8", "h200x8-busy"])
def exposition(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    scenario: str = request.param
    with DaemonProcess(tmp_path_factory.mktemp(scenario), scenario=scenario) as daemon:
        deadline = time.monotonic() + 60
        text = daemon.metrics()
        while not all(marker in text for marker in COMPLETE) and time.monotonic() < deadline:
            time.sleep(0.2)
            text = daemon.metrics()
        yield scenario, text


def _close(counted: int, documented: int) -> bool:
    return abs(counted - documented) <= TOLERANCE * documented


def test_the_node_totals_are_the_documented_budget(exposition: tuple[str, str]) -> None:
    scenario, text = exposition
    counted = len(_series(text))
    documented = _budget_row(f"`{scenario}`")
    assert _close(counted, documented), f"{scenario}: {counted} series exported, docs/metrics.md says {documented}"


def test_one_card_is_the_documented_budget(exposition: tuple[str, str]) -> None:
    scenario, text = exposition
    if scenario != "h200x8":
        pytest.skip("the per-card row is measured on h200x8")
    series = _series(text)
    uuid = next(labels["uuid"] for name, labels in series if name == "xpu_gpu_info" and labels.get("gpu") == "0")
    # the card's own series: those naming it, less the processes' and pods' (their own rows)
    mine = [n for n, labels in series if uuid in labels.values() and not re.match(r"xpu_(process|pod)_", n)]
    documented = _budget_row("H200 card")
    assert _close(len(mine), documented), f"card 0: {len(mine)} series, docs/metrics.md says {documented}"


def test_the_budget_rows_exist() -> None:
    assert _budget_row("`h200x8`") > 0 and _budget_row("`h200x8-busy`") > 0 and _budget_row("H200 card") > 0


def test_a_row_that_is_missing_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="no cardinality row"):
        _budget_row("no such node")
