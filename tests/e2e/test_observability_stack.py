"""The whole observability path with the real Prometheus and Alertmanager (Debian's packages): the simulated daemon
is scraped with the shipped rules, alerts are routed by the shipped Alertmanager example, and the webhook receiver
hands replace_node alerts to the hook (a JSON-lines spool here). Every dashboard query must return data.

Test-only rewrites (see tests/e2e/stack.py): rule ``for:`` 2s, Alertmanager group_wait/group_interval 1s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import yaml

from healthd.node_name import canonical_node_name
from tests.e2e.stack import ROOT, RULE_FILES, Stack, missing_binaries, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"not installed: {missing_binaries()}"),
]

# Metrics that dashboards use but that come from components not in this build. A query that needs one of them is
# skipped, naming it, only while the daemon does not export it. Empty: every component is in.
NOT_YET_EXPORTED: dict[str, str] = {}

# one lost card (replace_node), one hung card (reset_gpu), one NVLink down (reset_gpu)
LOST_GPU, HUNG_GPU, LINK_GPU, LINK = 3, 5, 1, 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack")).start()
    try:
        s.inject("gpu_lost", LOST_GPU)
        s.inject("hang", HUNG_GPU, "call=sample")
        s.inject("nvlink_down", LINK_GPU, f"link={LINK}")
        # partitions for the partitions dashboard: a TDM share on GPU 4 and a MIG instance on GPU 6
        for args in (
            ("mode", "4", "tdm"),
            ("create", "--gpu", "4", "--compute", "30", "--memory", "2GiB", "--owner-lease", "e2e", "--ttl", "3600"),
            ("mode", "6", "mig"),
            ("create", "--gpu", "6", "--compute", "10", "--memory", "8GiB", "--owner-lease", "e2e", "--ttl", "3600"),
        ):
            out = s.daemon.xpuctl("partitions", *args)
            assert out.returncode == 0, out.stderr
        yield s
    finally:
        s.stop()


def test_prometheus_loaded_every_shipped_rule(stack: Stack) -> None:
    shipped = {r["alert"] for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]}
    loaded = {r["name"] for r in stack.alerting_rules()}
    assert loaded == shipped
    assert all(r["health"] == "ok" for r in stack.alerting_rules())


def test_lost_card_reaches_the_hook_as_replace_node(stack: Stack) -> None:
    def delivered() -> list[dict[str, object]]:
        return [f for f in stack.hook_faults() if f["code"] == "XpuGpuFallenOffBus"]

    faults = wait_for("XpuGpuFallenOffBus delivered to the hook", delivered, timeout=60)
    fault = faults[0]
    assert fault["action"] == "replace_node" and fault["severity"] == "fatal"
    assert fault["gpu_index"] == LOST_GPU and fault["node_name"] == canonical_node_name()
    assert fault["idempotency_key"].startswith("flt-"), "the daemon's gpu_lost fault id, as its own push sends it"
    assert fault["evidence"]["receiver"] == "standby-replacement"
    assert json.loads(str(fault["fault_json"]))["status"] == "firing"


def test_gpu_level_alerts_go_to_operators_not_to_the_hook(stack: Stack) -> None:
    wanted = {"XpuGpuDriverCallHung": HUNG_GPU, "XpuGpuNvlinkDown": LINK_GPU}

    def routed() -> dict[str, dict[str, object]] | None:
        seen = {a["labels"]["alertname"]: a for a in stack.am_alerts() if a["labels"]["alertname"] in wanted}
        return seen if len(seen) == len(wanted) else None

    alerts = wait_for("GPU-level alerts in Alertmanager", routed, timeout=60)
    for name, alert in alerts.items():
        labels = alert["labels"]
        assert isinstance(labels, dict)
        # both faults' actions (driver probe: a hung call needs a reboot; nvlink probe: a dropped link too)
        assert labels["gpu"] == str(wanted[name]) and labels["action"] == "reboot_node"
        assert [r["name"] for r in alert["receivers"]] == ["ops"]  # type: ignore[union-attr]
    # the lost card's replace_node inhibits only that card's lesser alerts: these other cards' faults still notify
    assert all(a["status"]["state"] == "active" for a in alerts.values())  # type: ignore[index]
    wait_for("the lost card's delivery", lambda: stack.hook_faults(), timeout=60)
    assert {f["action"] for f in stack.hook_faults()} == {"replace_node"}


# ---- every dashboard query returns data ----

TEST_VALUES = {"$__rate_interval": "20s", "$__interval": "5s", "$__range": "1m", "$gpu": ".*", "$namespace": ".*",
               "$pod": ".*"}  # fmt: skip
METRIC_NAME = re.compile(r"\b(xpu_[a-z0-9_]+)\b")


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            out.extend((f"{path.stem}: {panel['title']} [{t['refId']}]", t["expr"]) for t in panel.get("targets", []))
    return out


QUERIES = dashboard_queries()


def substitute(expr: str, instance: str) -> str:
    for var, value in TEST_VALUES.items():
        expr = expr.replace(var, value)
    expr = expr.replace("$node", instance)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


@pytest.fixture(scope="module")
def exported(stack: Stack) -> set[str]:
    names = set()
    for line in stack.daemon.metrics().splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name + "_total" if kind == "counter" else name)
            names.add(name + "_info" if kind == "info" else name)
    return names


@pytest.mark.parametrize(("where", "expr"), QUERIES, ids=[q[0] for q in QUERIES])
def test_dashboard_query_returns_data(stack: Stack, exported: set[str], where: str, expr: str) -> None:
    missing = sorted(set(METRIC_NAME.findall(expr)) - exported)
    pending = [m for m in missing if m in NOT_YET_EXPORTED]
    unknown = [m for m in missing if m not in NOT_YET_EXPORTED]
    assert not unknown, f"{where}: the daemon does not export {unknown}"
    if pending:
        pytest.skip(f"needs {', '.join(pending)} from {NOT_YET_EXPORTED[pending[0]]}, not in this build")
    query = substitute(expr, stack.instance)
    wait_for(f"data for {where}: {query}", lambda: stack.query(query), timeout=20)


def test_dashboard_variables_resolve(stack: Stack) -> None:
    nodes = stack.query("group by (instance) (xpu_gpus)")
    assert [n["metric"]["instance"] for n in nodes] == [stack.instance]
    gpus = stack.query(f'group by (gpu) (xpu_gpu_info{{instance=~"{stack.instance}"}})')
    assert sorted(int(g["metric"]["gpu"]) for g in gpus) == list(range(8))
