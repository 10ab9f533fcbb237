"""container/dra/slices.py on the simulated h200x8 node: the pool built from the daemon's own answers (Partitions
GetCapacity, Topology.Get) validates against the 1.36 and 1.37 schemas in every mode, and the scheduler-side CEL of
sample DeviceClasses selects the devices it should.

The daemon's public API has no driver version, architecture, or MIG placements yet: tests/support/dra_published.py
carries them (NodeFacts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from container.dra import names
from container.dra.kubeapi import to_json
from container.dra.slices import CardTaint, build_pool
from healthd.api.v1 import partitions_pb2 as ppb
from tests.support.daemon_process import DaemonProcess
from tests.support.dra_cel import selected
from tests.support.dra_published import NODE, devices, inventory, published

pytestmark = pytest.mark.e2e


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER}" && {expression}'}}]},
    }


D = f'device.attributes["{names.DRIVER}"]'
GPU = device_class("gpu.xpu-runtime-kit.io", f'{D}.mode == "none"')
TDM = device_class("tdm.gpu.xpu-runtime-kit.io", f'{D}.mode == "tdm" && device.allowMultipleAllocations')
MIG_1G = device_class("mig-1g.gpu.xpu-runtime-kit.io", f'{D}.mode == "mig" && {D}.profile == "1g.18gb"')
BIG = device_class(
    "big.gpu.xpu-runtime-kit.io",
    f'device.capacity["{names.DRIVER}"].memory.compareTo(quantity("100Gi")) >= 0 && '
    f'{D}.driverVersion.isGreaterThan(semver("550.0.0"))',
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("daemon")) as d:
        yield d


def test_whole_cards_with_their_attributes_and_topology(daemon: DaemonProcess) -> None:
    capacity, topology = inventory(daemon, {})
    slices = published(capacity, topology, taints={2: [CardTaint("xid_79", "NoExecute")]})
    offered = devices(slices)
    assert sorted(offered) == [f"gpu-{i}" for i in range(6)]  # 6 and 7 have MIG on in hardware
    gpu0 = offered["gpu-0"]["attributes"]
    assert gpu0["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert gpu0["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert gpu0["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert gpu0["nvlinkDomain"] == {"string": "nvswitch"} and gpu0["driverVersion"] == {"version": "580.159.4"}
    assert offered["gpu-0"]["capacity"] == {"memory": {"value": "143771Mi"}}
    assert offered["gpu-2"]["taints"] == [{"key": "xpu-runtime-kit.io/fault", "value": "xid_79", "effect": "NoExecute"}]
    assert slices[0]["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert selected(GPU, slices) == [f"gpu-{i}" for i in range(6)]
    assert selected(BIG, slices) == [f"gpu-{i}" for i in range(6)]
    assert selected(TDM, slices) == []


def test_a_tdm_card_offers_consumable_compute_and_memory(daemon: DaemonProcess) -> None:
    capacity, topology = inventory(daemon, {3: "tdm"})
    slices = published(capacity, topology)
    tdm = devices(slices)["gpu-3-tdm"]
    assert tdm["allowMultipleAllocations"] is True
    assert tdm["capacity"]["compute"] == {
        "value": "100",
        "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
    }
    assert tdm["capacity"]["memory"]["requestPolicy"]["validRange"] == {
        "min": "128Mi",
        "max": "143744Mi",
        "step": "128Mi",
    }
    assert "gpu-3" not in devices(slices)
    assert selected(TDM, slices) == ["gpu-3-tdm"]
    inventory(daemon, {3: "none"})


def test_mig_cards_offer_every_free_placement_against_shared_counters(daemon: DaemonProcess) -> None:
    capacity, topology = inventory(daemon, {6: "mig", 7: "mig"})
    slices = published(capacity, topology)
    counters = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters") or []}
    assert sorted(counters) == ["gpu-6-mig", "gpu-7-mig"]
    assert counters["gpu-6-mig"]["compute-slices"] == {"value": "7"}
    assert counters["gpu-6-mig"]["1g-18gb-me-instances"] == {"value": "1"}  # one media-extension instance a card
    offered = devices(slices)
    on_6 = sorted(n for n in offered if n.startswith("gpu-6-"))
    assert len(on_6) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    big = offered["gpu-6-mig-3g-71gb-4"]
    assert big["consumesCounters"] == [
        {
            "counterSet": "gpu-6-mig",
            "counters": {
                **{f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)},
                "compute-slices": {"value": "3"},
            },
        }
    ]
    # card 7 has an operator's 3g.71gb at slices 0-3 and 2g.35gb at 4-5: only slices 6-7 are free
    assert sorted(n for n in offered if n.startswith("gpu-7-")) == [
        "gpu-7-mig-1g-18gb-6", "gpu-7-mig-1g-18gb-me-6", "gpu-7-mig-1g-35gb-6",
    ]  # fmt: skip
    assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert selected(MIG_1G, slices) == [f"gpu-6-mig-1g-18gb-{i}" for i in range(7)] + ["gpu-7-mig-1g-18gb-6"]
    inventory(daemon, {6: "none", 7: "none"})


def test_without_the_facts_the_api_lacks_mig_cards_offer_nothing(daemon: DaemonProcess) -> None:
    capacity, topology = inventory(daemon, {6: "mig"})
    pool = build_pool(NODE, capacity, topology)
    slices = [to_json(s) for s in pool.slices]
    assert not [n for n in devices(slices) if n.startswith("gpu-6")]
    assert "driverVersion" not in devices(slices)["gpu-0"]["attributes"]
    inventory(daemon, {6: "none"})


def test_a_node_of_eight_mig_cards_still_fits_the_limits(daemon: DaemonProcess) -> None:
    """The simulator has MIG on in hardware on two cards only: card 6's own answer stands in for all eight."""
    capacity, topology = inventory(daemon, {6: "mig"})
    eight = ppb.GetCapacityResponse()
    for gpu in range(8):
        card = eight.cards.add()
        card.CopyFrom(capacity.cards[6])
        card.gpu = gpu
    slices = published(eight, topology)
    assert len(devices(slices)) == 8 * 25 and len(slices) == 1 + 4  # 8 counter sets, then 64 devices a slice
    inventory(daemon, {6: "none"})
