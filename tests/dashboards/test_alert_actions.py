"""One source of truth for fault -> action: an alert and the daemon's fault for the same condition never disagree.

Every rule in alerts/*.rules.yml is one of:
- fault-driven: its expression reads ``xpu_faults_active`` and it takes ``action`` (and ``severity``) from the fault,
  or states the one action its matcher selects;
- mirrored: it alerts on the raw metric of a condition a probe (or an XID catalog entry) also turns into a fault;
  its ``action`` must be that fault's. The probes are run here on the simulated node with each condition injected,
  so the actions compared are the ones the daemon really raises, not a copy of them;
- without a fault: nothing in the daemon recommends an action for it, so its action is ``none``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest
import yaml

from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.daemon.config import parse_config
from healthd.findings import Action
from healthd.probes import ProbeHost, default_probes
from healthd.probes.base import Probe
from healthd.xid.catalog import load_catalog
from tests.support.clock import FakeClock
from tests.support.paths import REPO
from tests.support.probe_node import Node

ALERTS = REPO / "alerts"
NON_NONE = {a.label for a in Action if a > Action.RESTART_APP}

# alert -> the probe fault codes raised for the same condition
MIRRORED: dict[str, tuple[str, ...]] = {
    "XpuGpuMissing": ("gpu_count_low",),
    "XpuGpuResetRequired": ("gpu_reset_required",),
    "XpuGpuDriverCallHung": ("driver_call_timeout",),
    "XpuDriverDown": ("driver_unavailable",),
    "XpuGpuVolatileUncorrectableEcc": ("ecc_uncorrectable_volatile",),
    "XpuGpuRowRemapPending": ("ecc_row_remap_pending",),
    "XpuGpuMemoryLeak": ("memory_unowned",),
    "XpuGpuNvlinkDown": ("nvlink_down",),
    "XpuGpuNvlinkCrcErrorRateHigh": ("nvlink_crc_rate",),
    "XpuGpuNvlinkReplayErrors": ("nvlink_replay_errors",),
    "XpuGpuNvlinkRecoveryErrors": ("nvlink_recovery_errors",),
    "XpuGpuComputeProhibited": ("compute_mode_unexpected",),
    "XpuGpuThermalSlowdown": ("clocks_hw_slowdown",),
    "XpuGpuPowerSlowdown": ("clocks_hw_slowdown",),
}
# alert -> XIDs of the catalog that report the same condition
MIRRORED_XIDS: dict[str, tuple[int, ...]] = {
    "XpuGpuVolatileUncorrectableEcc": (48,),  # double-bit ECC error
}
# alerts no probe or XID turns into a fault: a person looks first
WITHOUT_FAULT = {
    "XpuGpuPcieReplayRateHigh",  # the PCIe probe judges link width and generation, not replays
    "XpuGpuComputeModeMixed",  # a node-wide comparison; each card's own mode is the configuration probe's
    "XpuHealthCheckFailed",  # any check; the faults it raised carry the actions
    "XpuExporterDown",
    "XpuExporterDataStale",
    "XpuExporterCollectorFailing",
    "XpuHookDeliveryFailing",
}


def _rules() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for path in sorted(ALERTS.glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.update({str(r["alert"]): r for r in group["rules"] if "alert" in r})
    return out


RULES = _rules()


def _action(rule: dict[str, object]) -> str:
    labels = rule["labels"]
    assert isinstance(labels, dict)
    return str(labels["action"])


def _fault_matchers(rule: dict[str, object]) -> tuple[str, str] | None:
    """(code matcher, action matcher) of the rule's xpu_faults_active selector, or None when it reads none."""
    selector = re.search(r"xpu_faults_active\{([^}]*)\}", str(rule["expr"]))
    if selector is None:
        return None
    code = re.search(r'code=~?"([^"]*)"', selector.group(1))
    action = re.search(r'action=~?"([^"]*)"', selector.group(1))
    assert code and action, f"{rule['alert']}: a fault-driven rule must select faults by code and action"
    return code.group(1), action.group(1)


def test_every_rule_is_classified_once() -> None:
    driven = {name for name, rule in RULES.items() if _fault_matchers(rule) is not None}
    kinds = [driven, set(MIRRORED) | set(MIRRORED_XIDS), WITHOUT_FAULT]
    for name in RULES:
        assert sum(name in kind for kind in kinds) == 1, f"{name}: fault-driven, mirrored or without a fault?"
    assert set().union(*kinds) == set(RULES), f"not rules: {sorted(set().union(*kinds) - set(RULES))}"


def test_rules_without_a_fault_recommend_no_action() -> None:
    for name in WITHOUT_FAULT:
        assert _action(RULES[name]) == "none", f"{name} recommends an action no fault of the daemon does"


@pytest.mark.parametrize("name", sorted(n for n, r in RULES.items() if _fault_matchers(r)))
def test_fault_driven_rules_take_the_fault_action(name: str) -> None:
    rule = RULES[name]
    matchers = _fault_matchers(rule)
    assert matchers is not None
    _code, action = matchers
    labels = rule["labels"]
    assert isinstance(labels, dict)
    if labels["action"] == "{{ $labels.action }}":
        assert set(action.split("|")) == NON_NONE, f"{name} passes through exactly the actions that need work"
        assert labels["severity"] == "{{ $labels.severity }}"
        assert re.search(r"\bby \([^)]*\baction\b[^)]*\bseverity\b", str(rule["expr"])), "keeps action, severity"
    else:
        assert action == labels["action"], f"{name} states {labels['action']} for faults whose action is {action}"


def test_every_xid_the_catalog_acts_on_reaches_exactly_one_alert_with_its_action() -> None:
    catalog = load_catalog()
    xid_rules = [(n, _fault_matchers(r)) for n, r in RULES.items()]
    xid_rules = [(n, m) for n, m in xid_rules if m is not None and re.fullmatch(m[0], "xid_79")]
    assert xid_rules, "no rule alerts on XID faults"
    for xid in catalog.xids():
        entry = catalog.lookup(xid)
        matching = [n for n, (code, action) in xid_rules if re.fullmatch(action, entry.action.label)]
        if entry.action is Action.NONE:
            assert not matching, f"XID {xid}: action none, yet {matching} alert on it"
            continue
        assert len(matching) == 1, f"XID {xid} ({entry.action.label}) reaches {matching}"
        stated = _action(RULES[matching[0]])
        assert stated in (entry.action.label, "{{ $labels.action }}"), f"XID {xid}: {matching[0]} says {stated}"


def test_rules_mirroring_an_xid_recommend_the_catalog_action() -> None:
    catalog = load_catalog()
    for name, xids in MIRRORED_XIDS.items():
        for xid in xids:
            assert catalog.lookup(xid).action.label == _action(RULES[name]), f"{name} vs XID {xid} in the catalog"


# --- the probes' own actions, from the simulated node -------------------------------------------------------------


@pytest.fixture(scope="module")
def raised() -> dict[str, set[Action]]:
    """Every fault code the default probes raise on the simulated node with each condition injected, and the
    actions they recommend (keyed by code). A condition that escalates (a hang grows into a reboot) shows each step;
    its fault carries the highest, which is what an alert that waited its ``for:`` must say."""
    clock = FakeClock()
    node = Node("h200x8", clock)
    settings = parse_config({"health": {"lost_cards": {"expected_gpus": 9}}}).health
    probes = default_probes(settings, ProbeHost())
    found: dict[str, set[Action]] = {}

    def run(snapshot: Snapshot, now: float, only: Iterator[Probe] | None = None) -> None:
        for probe in only if only is not None else probes:
            for finding in probe.evaluate(snapshot, now).findings:
                found.setdefault(finding.code, set()).add(finding.action)

    def tick() -> Snapshot:
        snap = node.tick()
        run(snap, clock.now)
        return snap

    try:
        for _ in range(2):
            healthy = tick()  # links seen up, counter baselines
        for kind, gpu, params in (
            ("gpu_lost", 2, {}),
            ("ecc", 0, {"uncorrected": "2"}),
            ("remap_pending", 1, {}),
            ("remap_failure", 3, {}),
            ("nvlink_down", 4, {"link": "3"}),
            ("nvlink_errors", 5, {"link": "1", "replay": "5", "recovery": "1", "crc": "100000"}),
            ("compute_mode", 6, {"mode": "prohibited"}),
            ("orphan_memory", 5, {"memory_mib": "8192"}),
        ):
            node.backend.inject(kind, gpu, params)
        for _ in range(8):
            tick()
        _driver_failures(healthy, clock.now, run)
        _hardware_slowdown(healthy, clock.now, run)
    finally:
        node.close()
    return found


def _with_gpu(snapshot: Snapshot, index: int, **changes: object) -> Snapshot:
    gpus = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in snapshot.gpus)  # type: ignore[arg-type]
    return dataclasses.replace(snapshot, gpus=gpus)


def _driver_failures(healthy: Snapshot, now: float, run: object) -> None:
    """States the simulator cannot produce: a card needing a reset, a call hung as long as the alert waits and
    NVML down."""
    assert callable(run)
    hung_for = _seconds(str(RULES["XpuGpuDriverCallHung"]["for"]))
    driver = [p for p in default_probes(parse_config({}).health, ProbeHost()) if p.name == "driver"]
    failing = _with_gpu(healthy, 0, fresh=False, error_code="reset_required", error="reset_required: x")
    failing = _with_gpu(failing, 1, fresh=False, error_code="timeout", error="timeout: sample has not returned")
    run(failing, now, iter(driver))
    run(failing, now + hung_for, iter(driver))
    down = dataclasses.replace(healthy, backend_up=False, backend_error="driver_unavailable: nvmlInit failed")
    run(down, now, iter(driver))


def _hardware_slowdown(healthy: Snapshot, now: float, run: object) -> None:
    """Clock-event reasons the simulator does not set: hardware thermal slowdown on card 7 for ten minutes."""
    assert callable(run)
    probes = default_probes(parse_config({}).health, ProbeHost())
    throttle = [p for p in probes if p.name == "clocks"]
    assert throttle, "the throttle probe is registered"
    card: GpuSnapshot | None = healthy.gpu(7)
    assert card is not None and card.sample is not None
    for step in range(12):
        t = now + step * 60
        slowed = dataclasses.replace(card.sample, clock_event_reasons=0x40)
        run(_with_gpu(healthy, 7, sample=slowed, sampled_at=t), t, iter(throttle))


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


@pytest.mark.parametrize("name", sorted(MIRRORED))
def test_rules_mirroring_a_probe_recommend_the_probe_action(name: str, raised: dict[str, set[Action]]) -> None:
    stated = _action(RULES[name])
    for code in MIRRORED[name]:
        assert code in raised, f"the simulated node never raised {code}; cannot compare {name} with it"
        fault = max(raised[code]).label
        assert fault == stated, f"{name} says {stated}, the {code} fault says {fault}"


def test_the_harness_sees_the_probes_real_findings(raised: dict[str, set[Action]]) -> None:
    """A condition judged on one sample, and one that escalates with time, both arrive as the probes raise them."""
    assert raised["gpu_lost"] == {Action.REPLACE_NODE}
    assert raised["driver_call_timeout"] == {Action.NONE, Action.REBOOT_NODE}, "a warning first, a reboot once hung"
