"""The Grafana dashboards: generated files up to date, well-formed, every panel with a unit, thresholds and
queries through the $datasource variable. (tests/e2e/test_observability_stack.py runs every query.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO

ROOT = REPO
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_generated_dashboards_are_up_to_date() -> None:
    sys.path.insert(0, str(ROOT / "dashboards"))
    try:
        import build  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    rendered = build.render()
    assert sorted(rendered) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], "run python3 dashboards/build.py"


def test_the_five_views_exist() -> None:
    titles = {_load(p)["title"] for p in DASHBOARDS}
    assert titles == {
        "XPU / Fleet overview",
        "XPU / Node GPUs",
        "XPU / Pods and processes",
        "XPU / Health and faults",
        "XPU / Partitions",
    }


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed(path: Path) -> None:
    dash = _load(path)
    assert dash["uid"] and dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "node" in variables
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"], panel["title"]
        assert defaults["thresholds"]["steps"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${datasource}"


def test_panels_do_not_overlap() -> None:
    for path in DASHBOARDS:
        cells: set[tuple[int, int]] = set()
        for panel in _load(path)["panels"]:
            pos = panel["gridPos"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{path.name}: {panel['title']} overlaps"
                    cells.add((x, y))


def test_provisioning_file_points_grafana_at_the_dashboards() -> None:
    doc = yaml.safe_load((ROOT / "dashboards" / "provisioning" / "xpu-runtime-kit.yml").read_text())
    (provider,) = doc["providers"]
    assert doc["apiVersion"] == 1 and provider["type"] == "file" and provider["options"]["path"]
