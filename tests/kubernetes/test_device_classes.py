"""The chart's DeviceClasses, as helm renders them, evaluated with a real CEL implementation against the devices
container/dra/slices.py publishes for the simulated h200x8 node in several mode mixes: each class selects exactly
the devices of its kind, every device belongs to one class, and the kind is read from the device's shape (TDM:
shared by allocation; MIG: consumes counters), not from the attribute the selectors test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.daemon_process import DaemonProcess
from tests.support.dra_cel import selected
from tests.support.dra_published import devices, inventory, published
from tests.support.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
sys.path.insert(0, str(DEPLOY))

import chart_build as build  # noqa: E402
import chart_validate as validate  # noqa: E402

pytestmark = [pytest.mark.deploy, pytest.mark.e2e]

MIXES = {
    "as booted": {},  # cards 6 and 7 have MIG on in hardware: not whole cards, and no MIG devices until set to MIG
    "every kind": {2: "tdm", 3: "tdm", 6: "mig", 7: "mig"},
    "no whole card": {0: "tdm", 1: "tdm", 2: "tdm", 3: "tdm", 4: "tdm", 5: "tdm", 6: "mig"},
}
KIND_OF_CLASS = {"gpu.xpu-runtime-kit.io": "whole", "tdm.xpu-runtime-kit.io": "tdm", "mig.xpu-runtime-kit.io": "mig"}


def shipped_classes() -> dict[str, dict[str, Any]]:
    objects = validate.documents(build.render(["--set", "draDriver.enabled=true"]))
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}


def kind(device: dict[str, Any]) -> str:
    if device.get("consumesCounters"):
        return "mig"
    if device.get("allowMultipleAllocations"):
        assert set(device["capacity"]) == {"compute", "memory"}
        return "tdm"
    assert set(device["capacity"]) == {"memory"}
    return "whole"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("daemon")) as d:
        yield d


@pytest.mark.parametrize("mix", list(MIXES))
def test_each_class_selects_exactly_its_kind(daemon: DaemonProcess, mix: str) -> None:
    classes = shipped_classes()
    assert set(classes) == set(KIND_OF_CLASS)
    modes = MIXES[mix]
    try:
        slices = published(*inventory(daemon, modes))
    finally:
        inventory(daemon, dict.fromkeys(modes, "none"))
    offered = devices(slices)
    by_kind: dict[str, set[str]] = {"whole": set(), "tdm": set(), "mig": set()}
    for name, device in offered.items():
        by_kind[kind(device)].add(name)
    for class_name, class_kind in KIND_OF_CLASS.items():
        chosen = selected(classes[class_name], slices)
        assert len(chosen) == len(set(chosen))
        assert set(chosen) == by_kind[class_kind], f"{mix}: {class_name}"
    tdm_cards = {g for g, m in modes.items() if m == "tdm"}
    assert by_kind["tdm"] == {f"gpu-{g}-tdm" for g in tdm_cards}
    assert by_kind["whole"] == {f"gpu-{g}" for g in range(6) if g not in modes}
    assert {n.split("-mig-")[0] for n in by_kind["mig"]} == {f"gpu-{g}" for g, m in modes.items() if m == "mig"}
