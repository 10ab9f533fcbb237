"""The status page's runbook links: the runbooks are the alert rules' own, and each active fault links to the rule
that alerts on it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from exporter.backends.simulated import SimulatedBackend
from healthd.daemon.runbooks import FAULT_ALERTS, alert_runbooks, runbook_for
from healthd.daemon.status_page import render_status_page
from healthd.findings import Action, Severity
from tests.healthd.daemon.test_status_page import Page, fault, sample
from tests.support.clock import FakeClock
from tests.support.paths import REPO

RULES = REPO / "alerts" / "xpu-healthd.rules.yml"


def _rules() -> dict[str, str]:
    rules = yaml.safe_load(RULES.read_text())
    return {
        r["alert"]: " ".join(str(r["annotations"].get("runbook", "")).split())
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def test_the_generated_runbooks_are_the_rules_own() -> None:
    spec = importlib.util.spec_from_file_location("runbooks_build", REPO / "alerts" / "runbooks_build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    generated = REPO / "healthd" / "daemon" / "runbooks_generated.py"
    assert generated.read_text() == build.render(), "run python3 alerts/runbooks_build.py"
    assert {a.alert: a.runbook for a in alert_runbooks()} == _rules()


def test_every_named_alert_exists_and_its_code_is_a_probes() -> None:
    rules = _rules()
    probes = "".join(p.read_text() for p in (REPO / "healthd" / "probes").glob("*.py"))
    for code, alert in FAULT_ALERTS.items():
        assert alert in rules, alert
        assert f'"{code}"' in probes, f"no probe raises {code}"


def test_faults_map_to_their_alerts() -> None:
    alerts = alert_runbooks()

    def name(code: str, action: Action) -> str | None:
        found = runbook_for(code, action.label, alerts)
        return found.alert if found else None

    assert name("xid_79", Action.REPLACE_NODE) == "XpuFatalXid"
    assert name("xid_13", Action.RESTART_APP) == "XpuApplicationXid"
    assert name("recovery_action_gpu_reset", Action.RESET_GPU) == "XpuGpuDriverRequestsRecovery"
    assert name("recovery_action_unknown", Action.NONE) == "XpuGpuDriverRecoveryAdvice"
    assert name("gpu_lost", Action.REPLACE_NODE) == "XpuGpuFallenOffBus"
    assert name("nvlink_down", Action.REBOOT_NODE) == "XpuGpuNvlinkDown"
    assert name("no_such_code", Action.NONE) is None


def test_an_active_fault_links_to_its_runbook(sim: SimulatedBackend, clock: FakeClock, tmp_path: Path) -> None:
    xid = fault("xid_79", 2, Severity.FATAL, Action.REPLACE_NODE, "GPU has fallen off the bus", clock.now, "xid")
    text = render_status_page(sample(sim, clock), clock.now, faults=lambda: [xid], runbooks=alert_runbooks())
    assert '<a href="#runbook-XpuFatalXid">XpuFatalXid</a>' in text
    assert '<li id="runbook-XpuFatalXid">' in text
    assert _rules()["XpuFatalXid"] in Page(text).words
