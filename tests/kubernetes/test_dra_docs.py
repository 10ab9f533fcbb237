"""docs/kubernetes.md, section "The DRA driver in the chart": every YAML block is valid for 1.36 and 1.37 (strict),
and every ResourceClaimTemplate in it can be met by the devices container/dra/slices.py publishes for the
simulated h200x8 node, with the devices the text says (tests/support/dra_requests.py: one claim at a time)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import kubernetes_validate
import pytest
import yaml

from healthd.api.v1 import partitions_pb2 as ppb
from tests.support.daemon_process import DaemonProcess
from tests.support.dra_published import devices, inventory, published
from tests.support.dra_requests import allocate
from tests.support.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
sys.path.insert(0, str(DEPLOY))

import chart_build as build  # noqa: E402
import chart_validate as validate  # noqa: E402

pytestmark = [pytest.mark.deploy, pytest.mark.e2e]
SECTION = "## The DRA driver in the chart"
GI = 2**30


def section_objects() -> list[dict[str, Any]]:
    text = (REPO / "docs" / "kubernetes.md").read_text()
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```$", body, flags=re.S | re.M)
    assert len(blocks) >= 6
    return [d for block in blocks for d in yaml.safe_load_all(block) if d]


OBJECTS = section_objects()
TEMPLATES = {o["metadata"]["name"]: o["spec"]["spec"] for o in OBJECTS if o["kind"] == "ResourceClaimTemplate"}


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_every_example_is_valid(version: str) -> None:
    for obj in OBJECTS:
        kubernetes_validate.validate(obj, version, strict=True)
    assert {o["kind"] for o in OBJECTS} == {"ResourceClaimTemplate", "Pod", "DeviceClass"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("daemon")) as d:
        yield d


@pytest.fixture(scope="module")
def classes() -> dict[str, dict[str, Any]]:
    shipped = validate.documents(build.render(["--set", "draDriver.enabled=true"]))
    return {o["metadata"]["name"]: o for o in [*shipped, *OBJECTS] if o["kind"] == "DeviceClass"}


@pytest.fixture(scope="module")
def every_kind(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """Whole cards 0, 1, 4, 5; TDM cards 2, 3; MIG cards 6, 7 (7 holds an operator's instances)."""
    modes = {2: "tdm", 3: "tdm", 6: "mig", 7: "mig"}
    try:
        return published(*inventory(daemon, modes))
    finally:
        inventory(daemon, dict.fromkeys(modes, "none"))


@pytest.fixture(scope="module")
def eight_whole(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """The simulator's cards 6 and 7 have MIG on in hardware: card 0's answer stands in for all eight (each with
    its own index and UUID, so its own place in the topology)."""
    capacity, topology = inventory(daemon, {})
    eight = ppb.GetCapacityResponse()
    for gpu in topology.gpus:
        card = eight.cards.add()
        card.CopyFrom(capacity.cards[0])
        card.gpu, card.gpu_uuid = gpu.index, gpu.uuid
    slices = published(eight, topology)
    assert len(devices(slices)) == 8
    return slices


def test_every_template_is_checked() -> None:
    assert sorted(TEMPLATES) == sorted(
        ["one-gpu", "two-gpus-close", "four-gpus-one-numa-node", "eight-gpus-one-nvlink-domain", "tdm-30c-2gi",
         "mig-1g-18gb", "gpu-and-nic"]
    )  # fmt: skip


def attribute(slices: list[dict[str, Any]], device: str, name: str) -> Any:
    return devices(slices)[device]["attributes"][name]


def test_whole_tdm_and_mig_examples_get_their_kind(classes: dict[str, Any], every_kind: list[dict[str, Any]]) -> None:
    (whole,) = allocate(TEMPLATES["one-gpu"], classes, every_kind).values()
    assert whole is not None and len(whole.devices) == 1 and whole.devices[0] in {"gpu-0", "gpu-1", "gpu-4", "gpu-5"}

    (share,) = allocate(TEMPLATES["tdm-30c-2gi"], classes, every_kind).values()
    assert share is not None and share.devices[0] in {"gpu-2-tdm", "gpu-3-tdm"}
    assert share.consumed[0] == {"compute": Fraction(30), "memory": Fraction(2 * GI)}

    (mig,) = allocate(TEMPLATES["mig-1g-18gb"], classes, every_kind).values()
    assert mig is not None and re.fullmatch(r"gpu-[67]-mig-1g-18gb-\d", mig.devices[0])
    assert attribute(every_kind, mig.devices[0], "profile") == {"string": "1g.18gb"}


def tdm_claim(requests: dict[str, str]) -> dict[str, Any]:
    """The TDM example with other capacity requests."""
    spec = yaml.safe_load(yaml.safe_dump(TEMPLATES["tdm-30c-2gi"]))
    spec["devices"]["requests"][0]["exactly"]["capacity"]["requests"] = requests
    return spec


def test_a_tdm_claim_the_card_cannot_hold_gets_no_device(
    classes: dict[str, Any], every_kind: list[dict[str, Any]]
) -> None:
    """The request policy the other way: more than 100 % or more memory than the card has is never allocated, an
    amount between steps is rounded up to the next 128 MiB, and what is not asked for is all of the card."""
    assert allocate(tdm_claim({"compute": "101"}), classes, every_kind) == {"share": None}
    assert allocate(tdm_claim({"memory": "141Gi"}), classes, every_kind) == {"share": None}
    (share,) = allocate(tdm_claim({"memory": "100Mi"}), classes, every_kind).values()
    assert share is not None and share.consumed[0] == {"compute": Fraction(100), "memory": Fraction(128 * 2**20)}


def without(slices: list[dict[str, Any]], names: set[str]) -> list[dict[str, Any]]:
    return [
        {**s, "spec": {**s["spec"], "devices": [d for d in s["spec"].get("devices") or [] if d["name"] not in names]}}
        for s in slices
    ]


def test_two_cards_close_get_a_pair_under_one_pcie_root_or_else_one_numa_node(
    classes: dict[str, Any], every_kind: list[dict[str, Any]], eight_whole: list[dict[str, Any]]
) -> None:
    (pair,) = allocate(TEMPLATES["two-gpus-close"], classes, every_kind).values()
    assert pair is not None and pair.request == "gpus/same-pcie-root"
    assert set(pair.devices) in ({"gpu-0", "gpu-1"}, {"gpu-4", "gpu-5"})
    # one card left under each PCIe root: the NUMA alternative
    odd = without(eight_whole, {"gpu-1", "gpu-3", "gpu-5", "gpu-7"})
    (numa,) = allocate(TEMPLATES["two-gpus-close"], classes, odd).values()
    assert numa is not None and numa.request == "gpus/same-numa-node"
    assert set(numa.devices) in ({"gpu-0", "gpu-2"}, {"gpu-4", "gpu-6"})
    # and no two cards on one NUMA node either: the claim cannot be met here
    assert allocate(TEMPLATES["two-gpus-close"], classes, without(odd, {"gpu-2", "gpu-6"})) == {"gpus": None}


def test_four_and_eight_cards_fit_a_node_of_eight_whole_cards(
    classes: dict[str, Any], eight_whole: list[dict[str, Any]], every_kind: list[dict[str, Any]]
) -> None:
    (four,) = allocate(TEMPLATES["four-gpus-one-numa-node"], classes, eight_whole).values()
    assert four is not None and set(four.devices) in ({f"gpu-{i}" for i in range(4)}, {f"gpu-{i}" for i in range(4, 8)})
    (eight,) = allocate(TEMPLATES["eight-gpus-one-nvlink-domain"], classes, eight_whole).values()
    assert eight is not None and len(eight.devices) == 8
    # with only two whole cards on each NUMA node, four on one node cannot be met
    assert allocate(TEMPLATES["four-gpus-one-numa-node"], classes, every_kind) == {"gpus": None}


def test_gpu_and_nic_the_gpu_side_has_the_standard_pcie_root(
    classes: dict[str, Any], every_kind: list[dict[str, Any]]
) -> None:
    found = allocate(TEMPLATES["gpu-and-nic"], classes, every_kind)
    assert found["nic"] is None  # another driver's devices: none on this node's slices
    gpu = found["gpu"]
    assert gpu is not None and gpu.devices[0] in {"gpu-0", "gpu-1", "gpu-4", "gpu-5"}
    assert attribute(every_kind, gpu.devices[0], "resource.kubernetes.io/pcieRoot")["string"].startswith("pci0000:")
