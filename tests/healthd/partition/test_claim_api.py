"""What a DRA driver needs from the Partitions API, through a real gRPC client on the unix sockets of the daemon
process on the simulated h200x8 node: a ResourceClaim owner the daemon never reclaims, a MIG instance at a named
profile and placement (refused clearly when that placement is taken or illegal), and per card the legal
placements, memory slices, media engines, driver version and architecture, as the real H200 reports them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from tests.support.daemon_process import DaemonProcess

CLAIM = pb.Owner(claim=pb.ClaimOwner(namespace="ml", name="train-gpu", uid="4b0c2a8e-1f3d-4e5a-9b6c-7d8e9f0a1b2c"))
CONFIG = "[partitions]\nreconcile_interval_seconds = 0.2\nowner_grace_seconds = 0\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(Path(tmp_path_factory.mktemp("claims")), extra_config=CONFIG) as d:
        yield d


@pytest.fixture
def admin(daemon: DaemonProcess) -> Iterator[Any]:
    with grpc.insecure_channel(f"unix:{daemon.tmp}/healthd-admin.sock") as channel:
        yield pb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]


def refused(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=20)
    return caught.value


def card(admin: Any, gpu: str) -> Any:
    return admin.GetCapacity(pb.GetCapacityRequest(gpu=gpu), timeout=20).cards[0]


def test_a_claim_owned_partition_outlives_reconcile_passes_and_goes_only_by_delete(admin: Any) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="1", mode=pb.PARTITION_MODE_TDM), timeout=20)
    made = admin.CreatePartition(
        pb.CreatePartitionRequest(owner=CLAIM, gpu="1", compute_percent=30, memory="2GiB", request_id="c1/gpu-1-tdm"),
        timeout=20,
    )
    assert made.owner.WhichOneof("kind") == "claim"
    assert (made.owner.claim.namespace, made.owner.claim.name) == ("ml", "train-gpu")
    assert made.lease_expires_at == 0
    # a short lease on the same card shows the reconciler runs meanwhile: it goes, the claim's partition stays
    lease = pb.Owner(lease=pb.LeaseOwner(holder="short", ttl_seconds=0.3))
    short = admin.CreatePartition(pb.CreatePartitionRequest(owner=lease, gpu="1", compute_percent=10), timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        ids = {p.id for p in admin.ListPartitions(pb.ListPartitionsRequest(gpu="1"), timeout=20).partitions}
        if short.id not in ids:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a few more passes
    ids = {p.id for p in admin.ListPartitions(pb.ListPartitionsRequest(gpu="1"), timeout=20).partitions}
    assert short.id not in ids and made.id in ids
    # a retry of the same request returns the same partition
    again = admin.CreatePartition(
        pb.CreatePartitionRequest(owner=CLAIM, gpu="1", compute_percent=30, memory="2GiB", request_id="c1/gpu-1-tdm"),
        timeout=20,
    )
    assert again.id == made.id
    assert admin.DeletePartition(pb.DeletePartitionRequest(id=made.id), timeout=20).deleted
    assert card(admin, "1").partitions == 0


@pytest.mark.parametrize(
    ("claim", "field"),
    [
        (pb.ClaimOwner(namespace="Bad_NS", name="c", uid="u-1"), "owner.claim.namespace"),
        (pb.ClaimOwner(namespace="ml", name="", uid="u-1"), "owner.claim.name"),
        (pb.ClaimOwner(namespace="ml", name="c", uid=""), "owner.claim.uid"),
        (pb.ClaimOwner(namespace="ml", name="c", uid="u 1\n"), "owner.claim.uid"),
    ],
)
def test_a_malformed_claim_owner_is_invalid_argument_naming_the_field(admin: Any, claim: Any, field: str) -> None:
    error = refused(
        admin.CreatePartition, pb.CreatePartitionRequest(owner=pb.Owner(claim=claim), gpu="1", compute_percent=5)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.details()


def test_mig_at_a_named_profile_and_placement(admin: Any) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=20)
    one = admin.CreatePartition(
        pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="1g.18gb", mig_placement_start=3), timeout=20
    )
    assert (one.mig.profile, one.mig.placement_start, one.mig.placement_size) == ("1g.18gb", 3, 1)
    assert one.mig.uuid.startswith("MIG-")
    by_id = admin.CreatePartition(
        pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="14", mig_placement_start=4), timeout=20
    )
    assert (by_id.mig.profile, by_id.mig.placement_start, by_id.mig.placement_size) == ("2g.35gb", 4, 2)
    try:
        taken = refused(
            admin.CreatePartition,
            pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="1g.35gb", mig_placement_start=2),
        )
        assert taken.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "memory slices 3-3 are held" in taken.details()
        illegal = refused(
            admin.CreatePartition,
            pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="2g.35gb", mig_placement_start=1),
        )
        assert illegal.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "legal starts: 0, 2, 4" in illegal.details()
        unknown = refused(
            admin.CreatePartition, pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="9g.999gb")
        )
        assert unknown.code() == grpc.StatusCode.INVALID_ARGUMENT and "no GPU-instance profile" in unknown.details()
        # no start: the daemon picks a free placement of that profile
        picked = admin.CreatePartition(pb.CreatePartitionRequest(owner=CLAIM, gpu="6", mig_profile="1g.18gb"))
        assert picked.mig.placement_start not in (3, 4, 5)
        admin.DeletePartition(pb.DeletePartitionRequest(id=picked.id), timeout=20)
    finally:
        for p in (one, by_id):
            admin.DeletePartition(pb.DeletePartitionRequest(id=p.id), timeout=20)


def test_a_placement_under_a_foreign_instance_is_refused(admin: Any) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="7", mode=pb.PARTITION_MODE_MIG), timeout=20)
    error = refused(
        admin.CreatePartition,
        pb.CreatePartitionRequest(owner=CLAIM, gpu="7", mig_profile="1g.18gb", mig_placement_start=2),
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "memory slices 0-3 are held" in error.details()


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"gpu": "6", "mig_placement_start": 0}, "mig_placement_start"),
        ({"gpu": "6", "mig_profile": "1g.18gb", "compute_percent": 10}, "mig_profile"),
        ({"gpu": "any", "mig_profile": "1g.18gb"}, "mig_profile"),
        ({"gpu": "6", "mig_profile": "1g.18gb;rm"}, "mig_profile"),
        ({"gpu": "6", "mig_profile": "1g." + "9" * 40 + "gb"}, "mig_profile"),
        ({"gpu": "6", "mig_profile": "1g.18gb", "mig_placement_start": 64}, "mig_placement_start"),
    ],
)
def test_malformed_mig_choices_are_invalid_argument(admin: Any, request_fields: dict[str, Any], field: str) -> None:
    error = refused(admin.CreatePartition, pb.CreatePartitionRequest(owner=CLAIM, **request_fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.details()


def test_a_mig_profile_on_a_tdm_card_is_a_failed_precondition(admin: Any) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="2", mode=pb.PARTITION_MODE_TDM), timeout=20)
    error = refused(admin.CreatePartition, pb.CreatePartitionRequest(owner=CLAIM, gpu="2", mig_profile="1g.18gb"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_capacity_carries_what_the_h200_reports(admin: Any, daemon: DaemonProcess) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=20)
    with grpc.insecure_channel(daemon.address) as channel:  # a read: the monitoring socket answers it
        reader = pb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 10
        while not (mig := reader.GetCapacity(pb.GetCapacityRequest(gpu="6"), timeout=20).cards[0]).driver_version:
            assert time.monotonic() < deadline, "no driver version after the first samples"
            time.sleep(0.1)
        whole = reader.GetCapacity(pb.GetCapacityRequest(gpu="0"), timeout=20).cards[0]
    for c in (mig, whole):
        assert (c.driver_version, c.architecture, c.cuda_compute_capability) == ("580.159.04", "Hopper", "9.0")
    assert (mig.mig_memory_slices, whole.mig_memory_slices) == (8, 0)
    profiles = {p.profile: p for p in mig.mig_profiles}
    placements = {name: [(r.start, r.size) for r in p.placements] for name, p in profiles.items()}
    # tests/fixtures/h200/mig-probe.log (nvmlDeviceGetGpuInstancePossiblePlacements of the real card)
    assert placements["1g.35gb"] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert placements["3g.71gb"] == [(0, 4), (4, 4)]
    assert placements["7g.141gb"] == [(0, 8)]
    media = {name: p.media for name, p in profiles.items()}
    assert (media["7g.141gb"].decoders, media["7g.141gb"].jpeg_decoders, media["7g.141gb"].optical_flow) == (7, 7, 1)
    assert (media["1g.18gb+me"].optical_flow, media["1g.18gb"].optical_flow) == (1, 0)
    assert media["7g.141gb"].copy_engines == 8 and media["2g.35gb"].encoders == 0


def test_xpuctl_creates_for_a_claim_at_a_placement(daemon: DaemonProcess, admin: Any) -> None:
    admin.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG), timeout=20)
    made = daemon.xpuctl(
        "partitions", "create", "--gpu", "6", "--owner-claim", "ml/c2/1234-abcd", "--mig-profile", "3g.71gb",
        "--mig-placement", "4", "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = daemon.xpuctl("partitions", "list", "--gpu", "6")
    assert "claim ml/c2" in listed.stdout
    parts = admin.ListPartitions(pb.ListPartitionsRequest(gpu="6"), timeout=20).partitions
    (mine,) = [p for p in parts if p.owner.claim.uid == "1234-abcd"]
    assert (mine.mig.profile, mine.mig.placement_start) == ("3g.71gb", 4)
    admin.DeletePartition(pb.DeletePartitionRequest(id=mine.id), timeout=20)
