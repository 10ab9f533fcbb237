"""The dashboards against Grafana's own schema: npm ``@grafana/schema`` types with TypeScript's ``satisfies``
(dashboards/schema_check.py; both packages pinned by dashboards/schema-check/package-lock.json).

Needs node and npm (``./dev test`` installs Debian's). In CI (CI set) a missing tool is a failure, elsewhere a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.paths import REPO

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))


@pytest.fixture(scope="module")
def schema_check() -> ModuleType:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the Grafana schema check (./dev test installs them)")
        pytest.skip("node or npm not installed (./dev test installs them)")
    sys.path.insert(0, str(REPO / "dashboards"))
    try:
        import schema_check as module  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    module.install()
    return module  # type: ignore[no-any-return]


def test_every_dashboard_satisfies_grafanas_schema(schema_check: ModuleType) -> None:
    assert schema_check.check(DASHBOARDS) == []


def test_the_check_rejects_what_the_schema_rejects(schema_check: ModuleType, tmp_path: Path) -> None:
    """A negative control: a link without its required icon, an unknown variable key and a value outside an enum."""
    dash: dict[str, Any] = json.loads((REPO / "dashboards" / "xpu-health.json").read_text())
    dash["links"][0].pop("icon")
    dash["templating"]["list"][1]["definition"] = "label_values(xpu_gpus, instance)"
    panel = next(p for p in dash["panels"] if p["type"] != "row")
    panel["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolutely"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dash))
    diagnostics = "\n".join(schema_check.check([bad]))
    assert "Property 'icon' is missing" in diagnostics
    assert "'\"definition\"' does not exist" in diagnostics
    assert '\'"absolutely"\' is not assignable to type \'"absolute" | "percentage"\'' in diagnostics


def test_links_carry_every_field_grafana_requires() -> None:
    for path in DASHBOARDS:
        for link in json.loads(path.read_text())["links"]:
            required = ("title", "type", "icon", "tooltip", "asDropdown", "targetBlank", "includeVars", "keepTime")
            assert all(key in link for key in (*required, "tags")), (path.name, link)
