"""The GPU recovery action decoded by driver branch: each branch's numbering, the metric code, the driver finding.

The raw values per branch are the ``NVML_GPU_RECOVERY_ACTION_*`` constants of the nvidia-ml-py release made for that
branch (listed below as the bindings define them) plus NVML's change log where the bindings lag (595 added
RECOVER_IMEX_DOMAIN; its bindings list only 0-4).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from pathlib import Path

import pynvml
import pytest
from prometheus_client.core import Metric

from exporter.backends.recovery import (
    UNKNOWN_RECOVERY_CODE,
    RecoveryAction,
    decode_recovery_action,
    driver_branch,
    recovery_code,
)
from exporter.collectors.card import CardCollector
from exporter.snapshot import Snapshot
from healthd.daemon.status_page import Problem, card_problems
from healthd.findings import Action, ProbeReport, Severity
from healthd.probes.driver import DriverProbe
from tests.support.clock import FakeClock
from tests.support.faults_helpers import make_engine
from tests.support.probe_node import Node, codes, only

# nvidia-ml-py release -> its NVML_GPU_RECOVERY_ACTION_* constants (pynvml.py of each wheel).
_R570 = {"NONE": 0, "GPU_RESET": 1, "NODE_REBOOT": 2, "DRAIN_P2P": 3, "DRAIN_AND_RESET": 4}
BINDINGS: dict[str, dict[str, int]] = {
    "12.570.86": _R570,
    "12.575.51": _R570,
    "13.580.65": {**_R570, "GPU_RESET_BUS": 5},
    "13.580.126": {**_R570, "GPU_RESET_BUS": 5},
    "13.590.48": _R570,
    "13.595.45": _R570,
    "13.610.43": {**_R570, "RECOVER_IMEX_DOMAIN": 5},
    "13.615.71": {**_R570, "RECOVER_IMEX_DOMAIN": 5, "BUS_RESET": 6, "SYSTEM_REBOOT": 7},
}
ALIASES = {"GPU_RESET_BUS": "BUS_RESET"}  # R580's name for the bus reset that 615 calls BUS_RESET


def _action(name: str) -> RecoveryAction:
    return RecoveryAction[ALIASES.get(name, name)]


@pytest.mark.parametrize("release", sorted(BINDINGS))
def test_every_binding_release_decodes_as_its_branch_defines(release: str) -> None:
    branch = release.split(".")[1]
    driver = f"{branch}.10.02"
    for name, raw in BINDINGS[release].items():
        assert decode_recovery_action(raw, driver) is _action(name), (release, name)
    undefined = set(range(9)) - set(BINDINGS[release].values())
    if branch != "595":  # 595 defines 5 in its nvml.h (change log) although its bindings do not list it
        assert all(decode_recovery_action(raw, driver) is None for raw in undefined), release


def test_the_installed_bindings_agree_with_their_branch() -> None:
    """Whatever nvidia-ml-py is installed (the floor job installs the oldest), its constants decode as named."""
    branch = importlib.metadata.version("nvidia-ml-py").split(".")[1]
    constants = {
        name.removeprefix("NVML_GPU_RECOVERY_ACTION_"): int(value)
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_GPU_RECOVERY_ACTION_")
    }
    assert constants, "the installed nvidia-ml-py predates NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
    for name, raw in constants.items():
        assert decode_recovery_action(raw, f"{branch}.1") is _action(name), name


@pytest.mark.parametrize(
    ("driver", "raw", "expected"),
    [
        ("565.57.01", 3, RecoveryAction.DRAIN_P2P),
        ("565.57.01", 4, None),  # DRAIN_AND_RESET came with 570
        ("570.86.15", 4, RecoveryAction.DRAIN_AND_RESET),
        ("580.159.04", 5, RecoveryAction.BUS_RESET),  # the H200 capture's driver: 5 is a bus reset
        ("580.159.04", 6, None),
        ("590.48.01", 5, None),
        ("595.45.04", 5, RecoveryAction.RECOVER_IMEX_DOMAIN),
        ("610.43", 5, RecoveryAction.RECOVER_IMEX_DOMAIN),
        ("615.71.01", 6, RecoveryAction.BUS_RESET),
        ("615.71.01", 7, RecoveryAction.SYSTEM_REBOOT),
        ("700.1", 7, RecoveryAction.SYSTEM_REBOOT),  # a newer branch keeps the newest numbering
        ("700.1", 8, None),
        ("535.129.03", 1, RecoveryAction.GPU_RESET),  # older than the field: never reported, decoded like 565
    ],
)
def test_branch_numbering(driver: str, raw: int, expected: RecoveryAction | None) -> None:
    assert decode_recovery_action(raw, driver) is expected


@pytest.mark.parametrize("driver", [None, "", "unknown", "r580"])
def test_without_a_branch_only_the_values_every_branch_shares(driver: str | None) -> None:
    assert driver_branch(driver) is None
    assert [decode_recovery_action(raw, driver) for raw in range(8)] == [
        RecoveryAction.NONE,
        RecoveryAction.GPU_RESET,
        RecoveryAction.NODE_REBOOT,
        RecoveryAction.DRAIN_P2P,
        RecoveryAction.DRAIN_AND_RESET,
        None,  # bus reset on R580, IMEX from R595: not guessed
        None,
        None,
    ]


def test_driver_branch_parses_nvidia_versions() -> None:
    assert [driver_branch(v) for v in ("580.159.04", "610.43", "570", " 575.51.03 ")] == [580, 610, 570, 575]


def test_metric_code_is_branch_independent() -> None:
    assert recovery_code(5, "580.159.04") == recovery_code(6, "615.71.01") == RecoveryAction.BUS_RESET == 6
    assert recovery_code(5, "595.45.04") == RecoveryAction.RECOVER_IMEX_DOMAIN == 5
    assert recovery_code(5, "590.48.01") == UNKNOWN_RECOVERY_CODE == -1


# --- the driver probe, the metric and the status page on a simulated node (driver 580.159.04) --------------------


def _with_driver(snapshot: Snapshot, version: str) -> Snapshot:
    assert snapshot.system is not None
    return dataclasses.replace(snapshot, system=dataclasses.replace(snapshot.system, driver_version=version))


def _recovery_metric(snapshot: Snapshot) -> dict[str, float]:
    family: Metric = next(m for m in CardCollector().collect(snapshot, 0) if m.name == "xpu_gpu_recovery_action")
    return {s.labels["gpu"]: s.value for s in family.samples}


def _shown(tmp_path: Path, clock: FakeClock, snapshot: Snapshot, report: ProbeReport) -> dict[int, list[Problem]]:
    """What the status page shows per card (cards with nothing left out) once the daemon's fault engine has taken
    one driver-probe report."""
    engine = make_engine(tmp_path, clock)
    engine.accept_report(report)
    shown = {g.index: card_problems(g, engine.check_states(), engine.active_faults()) for g in snapshot.gpus}
    return {index: problems for index, problems in shown.items() if problems}


def test_r580_bus_reset_is_a_reset_not_a_warning(h200x8: Node, tmp_path: Path) -> None:
    h200x8.inject("recovery_action", 3, code=5)
    snapshot = h200x8.tick()
    assert snapshot.system is not None and snapshot.system.driver_version == "580.159.04"
    report = DriverProbe().evaluate(snapshot, 0)
    finding = only(report, "recovery_action_bus_reset")
    assert (finding.severity, finding.action) == (Severity.CRITICAL, Action.RESET_GPU)
    assert finding.gpu is not None and finding.gpu.index == 3
    assert finding.evidence["recovery_action"] == "5" and finding.evidence["driver_version"] == "580.159.04"
    assert _recovery_metric(snapshot)["3"] == 6.0 and _recovery_metric(snapshot)["0"] == 0.0
    # the page shows the driver probe's result, not a rule of its own
    shown = _shown(tmp_path, h200x8.clock, snapshot, report)
    assert shown == {3: [Problem("bad", "driver: the driver asks for recovery action bus reset (raw 5)")]}


def test_the_same_raw_value_on_r615_is_the_imex_domain(h200x8: Node) -> None:
    h200x8.inject("recovery_action", 3, code=5)
    snapshot = _with_driver(h200x8.tick(), "615.71.01")
    report = DriverProbe().evaluate(snapshot, 0)
    finding = only(report, "recovery_action_recover_imex_domain")
    assert (finding.severity, finding.action) == (Severity.WARNING, Action.NONE)
    assert _recovery_metric(snapshot)["3"] == 5.0


def test_a_value_the_branch_lacks_is_reported_as_unknown(h200x8: Node, tmp_path: Path) -> None:
    h200x8.inject("recovery_action", 1, code=5)
    snapshot = _with_driver(h200x8.tick(), "590.48.01")
    report = DriverProbe().evaluate(snapshot, 0)
    finding = only(report, "recovery_action_unknown")
    assert (finding.severity, finding.action) == (Severity.WARNING, Action.NONE)
    assert "R590" in finding.message and "5" in finding.message
    assert _recovery_metric(snapshot)["1"] == -1.0
    assert _shown(tmp_path, h200x8.clock, snapshot, report) == {1: [Problem("warn", f"driver: {finding.message}")]}


def test_r615_system_reboot_asks_for_a_reboot(h200x8: Node) -> None:
    h200x8.inject("recovery_action", 2, code=7)
    snapshot = _with_driver(h200x8.tick(), "615.71.01")
    report = DriverProbe().evaluate(snapshot, 0)
    finding = only(report, "recovery_action_system_reboot")
    assert finding.action is Action.REBOOT_NODE
    h200x8.inject("recovery_action", 2, code=0)
    assert codes(DriverProbe().evaluate(h200x8.tick(), 0)) == set()
