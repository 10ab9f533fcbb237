"""What the dashboards say about faults: which card has which fault (a per-card table with code, action and since),
fault panels that keep the ``gpu`` label, and XID counts that show a card's first XID.

The XID query is evaluated by promtool (Debian's prometheus package) on series shaped like the daemon's: a counter
series is born at its first event, already at 1. tests/e2e/test_alert_pipeline.py runs the per-card table on a live
Prometheus after an injected XID 79.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO

DASHBOARDS = REPO / "dashboards"


def panels(name: str) -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in json.loads((DASHBOARDS / name).read_text())["panels"]}


def exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


@pytest.mark.parametrize("name", ["xpu-health.json", "xpu-fleet.json", "xpu-node.json"])
def test_faults_per_card_table(name: str) -> None:
    panel = panels(name)["Faults per card"]
    assert panel["type"] == "table"
    active, since = panel["targets"]
    assert active["format"] == since["format"] == "table" and active["instant"] and since["instant"]
    assert re.fullmatch(r"xpu_faults_active\{instance=~\"\$node\"(, gpu=~\"\$gpu\")?\} > 0", active["expr"])
    # since when: the daemon's own opening time of each fault (one series per fault id), not a range subquery
    where = active["expr"].removeprefix("xpu_faults_active").removesuffix(" > 0")
    assert since["expr"] == f"1000 * xpu_fault_opened_timestamp_seconds{where}"
    organize = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]
    headers = organize["renameByName"]
    assert {headers[k] for k in ("gpu", "code", "action", "fault_id", "Value #B")} == {
        "Card",
        "Code",
        "Action",
        "Fault",
        "Since",
    }
    assert organize["excludeByName"]["Value #A"]  # the 1 of each active series says nothing
    (override,) = panel["fieldConfig"]["overrides"]
    assert override["matcher"]["options"] == "Value #B"
    assert override["properties"] == [{"id": "unit", "value": "dateTimeAsIso"}]  # milliseconds since the epoch


def test_no_fault_panel_drops_the_card() -> None:
    """Every query over xpu_faults_active that aggregates keeps gpu, so each line or row names its card."""
    checked = 0
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for expr in exprs(panel) if "targets" in panel else []:
                if "xpu_faults_active" not in expr or expr.startswith(("sum(", "count(")):
                    continue  # a single total (the fleet's "Faults needing action" stat)
                checked += 1
                for by in re.findall(r"\bby \(([^)]*)\)", expr):
                    assert "gpu" in [label.strip() for label in by.split(",")], f"{path.name} {panel['title']}: {expr}"
    assert checked >= 5


# ---- the first XID counts ----

XID = 'xpu_xid_errors_total{gpu="2",instance="node-1:9410",job="xpu-healthd",uuid="GPU-2",xid="79"}'
SCRAPE = "15s"


def _xid_panel_expr() -> str:
    (expr,) = exprs(panels("xpu-health.json")["XID events"])
    return expr.replace("$__rate_interval", "1m").replace('instance=~"$node"', 'instance=~"node-1:9410"')


def _promtool_eval(tmp_path: Path, expr: str, series: str, points: list[tuple[str, float]]) -> None:
    """promtool evaluates expr at each eval time; each expected value is the query's one sample."""
    tests = [
        {
            "expr": expr,
            "eval_time": at,
            "exp_samples": [{"labels": '{gpu="2", xid="79"}', "value": value}],
        }
        for at, value in points
    ]
    spec = {
        "rule_files": [],
        "evaluation_interval": SCRAPE,
        "tests": [{"interval": SCRAPE, "input_series": [{"series": XID, "values": series}], "promql_expr_test": tests}],
    }
    path = tmp_path / "xid.test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{expr}\n{done.stdout}{done.stderr}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) missing")
def test_a_first_xid_counts_as_one(tmp_path: Path) -> None:
    """The series appears at 1m (born at 1, no 0 before it) and stays at 1: one XID 79, shown as 1 for one window."""
    _promtool_eval(
        tmp_path,
        _xid_panel_expr(),
        "_x4 1x12",  # absent for 4 scrapes (0-45s), then 1 from 1m on
        [("1m", 1), ("1m30s", 1), ("1m45s", 1)],
    )


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) missing")
def test_later_xids_count_by_increase(tmp_path: Path) -> None:
    """Once the series is older than the window, growth is increase(): a second XID at 3m shows as 1, then 0."""
    _promtool_eval(
        tmp_path,
        _xid_panel_expr(),
        "_x4 1x7 2x8",  # born at 1m, second XID at 2m45s
        [("2m30s", 0), ("3m", 1), ("4m", 0)],
    )
