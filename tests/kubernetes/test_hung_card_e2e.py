"""A node that boots with one bad GPU still serves the other seven to Kubernetes: the real daemon on the simulated
node with card 3 hung from start-up (tests/support/hung_at_start.py), the real plugin registered with the kubelet
double (tests/support/kubelet_devicemanager.py). Kubelet is offered the seven cards that answer, and the slices of
one set to TDM, but not card 3; Allocate works on them; card 3 joins kubelet's list once it answers."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from tests.kubernetes.stack import GPU, scenario_without_mig, stack
from tests.kubernetes.test_slices_e2e import serving

pytestmark = pytest.mark.e2e

HUNG = 3
TDM = "xpu-runtime-kit.io/tdm-25c.32gib"
SHAPES = '[tdm]\nshapes = [{compute_percent = 25, memory = "32GiB"}]\n'


def card_uuids(address: str) -> dict[int, str]:
    """GPU index -> UUID of every card the daemon's partition service serves now."""
    with grpc.insecure_channel(address) as channel:
        stub = ppb_grpc.PartitionsStub(channel)
        cards = stub.GetCapacity(ppb.GetCapacityRequest(), timeout=10).cards
    return {c.gpu: c.gpu_uuid for c in cards}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("call", ["*", "device_info"])
def test_seven_cards_are_offered_while_one_is_hung_from_start_up(tmp_path: Path, call: str) -> None:
    scenario = str(scenario_without_mig(tmp_path))  # every card a whole card while in mode none
    with stack(tmp_path, scenario=scenario, plugin_config=SHAPES, hung_at_start=(HUNG, call)) as (daemon, kubelet, _):
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 7, "seven whole cards offered")
        uuids = card_uuids(daemon.address)
        assert sorted(uuids) == [0, 1, 2, 4, 5, 6, 7]
        answering = sorted(uuids.values())
        assert kubelet.healthy(GPU) == answering
        assert sorted(d.ID for d in kubelet.devices(GPU)) == answering  # card 3 not listed at all, not even Unhealthy
        capacity, allocatable, _ = kubelet.capacity()
        assert (capacity[GPU], allocatable[GPU]) == (7, 7)

        # a healthy card set to TDM: kubelet is offered its slices, and it is no longer a whole card
        done = daemon.xpuctl("partitions", "mode", "0", "tdm")
        assert done.returncode == 0, done.stderr
        kubelet.wait(lambda: len(kubelet.healthy(TDM)) == 4, "card 0 offers four 25 %/32 GiB slots")
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 6, "card 0 left the whole cards")
        assert {d.ID.split("::")[0] for d in kubelet.devices(TDM)} == {uuids[0]}

        # Allocate through kubelet: a whole card, and a slice (a partition made on card 0 while card 3 hangs)
        (card,), response = kubelet.admit("team", "train-0", "main", GPU, 1)
        assert card in answering and card != uuids[0]
        assert response.envs["CUDA_VISIBLE_DEVICES"] == card
        assert [c.name for c in response.cdi_devices] == [f"{GPU}={card}"]
        (slot,), response = kubelet.admit("team", "infer-0", "server", TDM, 1)
        made = serving(daemon.address, TDM, slot)
        assert made is not None and made.gpu == 0 and made.state == "ready"
        assert response.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"

        # the card answers: the partition service takes it in and kubelet is offered it
        cleared = daemon.xpuctl("simulate", "clear", "--gpu", str(HUNG))
        assert cleared.returncode == 0, cleared.stderr
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 7, f"card {HUNG} joins kubelet's list")
        joined = card_uuids(daemon.address)
        assert sorted(joined) == list(range(8))
        assert joined[HUNG] not in answering
        assert kubelet.healthy(GPU) == sorted(u for i, u in joined.items() if i != 0)
        capacity, allocatable, _ = kubelet.capacity()
        assert (capacity[GPU], allocatable[GPU]) == (7, 7)
