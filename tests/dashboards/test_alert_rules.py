"""The shipped alert rules: promtool accepts them, every rule carries the labels and texts operators rely on, and
promtool unit tests (alerts/tests/) cover every rule."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support.paths import REPO

ROOT = REPO
ALERTS = ROOT / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yml"))
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))
SEVERITIES = {"info", "warning", "critical", "fatal"}
ACTIONS = {"none", "restart_app", "reset_gpu", "reboot_node", "replace_node"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) missing")


def _rules() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(r for r in group["rules"] if "alert" in r)
    return out


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for amount, unit in re.findall(r"(\d+)(ms|s|m|h|d)", duration):
        total += int(amount) * units[unit]
    return total


@needs_promtool
def test_promtool_check_rules_is_clean() -> None:
    assert RULE_FILES
    result = subprocess.run(
        ["promtool", "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    assert TEST_FILES
    result = subprocess.run(
        ["promtool", "test", "rules", *map(str, TEST_FILES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: str(r["alert"]))
def test_rule_has_severity_action_texts_and_a_flap_resistant_for(rule: dict[str, object]) -> None:
    labels = rule.get("labels")
    annotations = rule.get("annotations")
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    templated = "{{ $labels.severity }}", "{{ $labels.action }}"
    # a rule may pass the severity/action of the fault it alerts on through; then its expr must restrict them
    if labels["severity"] not in templated:
        assert labels["severity"] in SEVERITIES
    if labels["action"] == "{{ $labels.action }}":
        assert 'action=~"reset_gpu|reboot_node|replace_node"' in str(rule["expr"])
    else:
        assert labels["action"] in ACTIONS
    assert annotations.get("summary") and annotations.get("runbook")
    assert _seconds(str(rule.get("for", "0s"))) >= 30


def test_every_rule_fires_in_a_unit_test() -> None:
    fired: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            fired.update(c["alertname"] for c in test.get("alert_rule_test", []) if c["exp_alerts"])
    missing = sorted({str(r["alert"]) for r in _rules()} - fired)
    assert not missing, f"rules without a firing unit test: {missing}"


# Rules about the node as a whole; every other rule is about one card and must say which.
NODE_LEVEL = {
    "XpuGpuMissing",
    "XpuDriverDown",
    "XpuGpuComputeModeMixed",
    "XpuExporterDown",
    "XpuExporterDataStale",
    "XpuExporterCollectorFailing",
    "XpuHookDeliveryFailing",
}


def test_per_card_alerts_fire_with_gpu_and_uuid_in_the_unit_tests() -> None:
    """The promtool unit tests expect gpu and uuid on every firing per-card alert (so the rule keeps them)."""
    names = {str(r["alert"]) for r in _rules()}
    assert names >= NODE_LEVEL
    checked: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                if check["alertname"] in NODE_LEVEL:
                    continue
                for alert in check["exp_alerts"]:
                    labels = alert["exp_labels"]
                    assert labels.get("gpu") and labels.get("uuid"), f"{check['alertname']} fires without a card"
                    checked.add(check["alertname"])
    assert checked == names - NODE_LEVEL


@pytest.mark.parametrize("rule", [r for r in _rules() if r["alert"] not in NODE_LEVEL], ids=lambda r: str(r["alert"]))
def test_per_card_rules_keep_gpu_and_uuid(rule: dict[str, object]) -> None:
    for grouping in re.findall(r"\bby \(([^)]*)\)", str(rule["expr"])):
        kept = {label.strip() for label in grouping.split(",")}
        assert {"gpu", "uuid"} <= kept, f"{rule['alert']} aggregates away the card: by ({grouping})"


def test_generated_unit_tests_are_up_to_date() -> None:
    sys.path.insert(0, str(ALERTS / "tests"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert (ALERTS / "tests" / "xpu-healthd.test.yml").read_text() == generate.text(), (
        "run python3 alerts/tests/generate.py"
    )


needs_amtool = pytest.mark.skipif(
    shutil.which("amtool") is None, reason="amtool (Debian: prometheus-alertmanager) missing"
)
AM_EXAMPLE = ALERTS / "alertmanager.example.yml"


@needs_amtool
def test_alertmanager_example_is_valid() -> None:
    result = subprocess.run(["amtool", "check-config", str(AM_EXAMPLE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["action=replace_node", "severity=fatal", "alertname=XpuGpuFallenOffBus"], "standby-replacement,ops"),
        (["action=replace_node", "severity=fatal", "alertname=XpuFatalXid", "code=xid_79"], "standby-replacement,ops"),
        (["action=restart_app", "severity=warning", "alertname=XpuApplicationXid", "code=xid_13"], "ops"),
        (["action=reboot_node", "severity=critical", "alertname=XpuGpuNvlinkDown"], "ops"),
        (["action=reboot_node", "severity=fatal", "alertname=XpuDriverDown"], "ops"),
    ],
)
def test_only_replace_node_alerts_route_to_the_hook(labels: list[str], receivers: str) -> None:
    result = subprocess.run(
        ["amtool", "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.strip() == receivers, result.stdout + result.stderr


def test_every_rule_is_listed_in_the_readme() -> None:
    readme = (ALERTS / "README.md").read_text()
    missing = [str(r["alert"]) for r in _rules() if f"| `{r['alert']}` |" not in readme]
    assert not missing, f"alerts/README.md does not list {missing}"
