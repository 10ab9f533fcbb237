"""The Partitions API through real gRPC on unix sockets: concurrent clients, statuses for bad input, access split."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from tests.support.partition_node import Daemon

CARD_BYTES = 143771 * 2**20


def stub(address: str) -> Any:
    return pb_grpc.PartitionsStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]


def lease(holder: str = "t") -> Any:
    return pb.Owner(lease=pb.LeaseOwner(holder=holder))


def code_of(fn: Any, request: Any) -> grpc.StatusCode:
    try:
        fn(request, timeout=20)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def set_mode(d: Daemon, gpu: str, mode: int) -> None:
    stub(d.admin).SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=mode), timeout=20)


def clear(d: Daemon, gpu: str) -> None:
    s = stub(d.admin)
    for p in s.ListPartitions(pb.ListPartitionsRequest(gpu=gpu), timeout=20).partitions:
        s.DeletePartition(pb.DeletePartitionRequest(id=p.id), timeout=20)


def test_concurrent_clients_never_overcommit(daemon: Daemon) -> None:
    set_mode(daemon, "1", pb.PARTITION_MODE_TDM)
    clear(daemon, "1")
    over: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        reader = stub(daemon.read)
        while not stop.is_set():
            card = reader.GetCapacity(pb.GetCapacityRequest(gpu="1"), timeout=20).cards[0]
            if card.compute_percent_allocated > 100 or card.memory_allocated_bytes > CARD_BYTES:
                over.append(str(card))

    rejected: list[int] = []
    codes: list[grpc.StatusCode] = []

    def client(i: int) -> list[str]:
        s = stub(daemon.admin)
        made = []
        for j in range(6):
            request = pb.CreatePartitionRequest(owner=lease(f"c{i}"), gpu="1", compute_percent=10, memory="4GiB")
            try:
                made.append(s.CreatePartition(request, timeout=20).id)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                rejected.append(i)
            if j % 3 == 2 and made:
                s.DeletePartition(pb.DeletePartitionRequest(id=made.pop(0)), timeout=20)
        return made

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(12) as pool:
        kept = [pid for ids in pool.map(client, range(12)) for pid in ids]
    stop.set()
    watcher.join()
    assert over == []
    assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    card = stub(daemon.read).GetCapacity(pb.GetCapacityRequest(gpu="1"), timeout=20).cards[0]
    assert card.partitions == len(kept)
    assert card.compute_percent_allocated == 10 * len(kept) <= 100
    # without rejections the clients would end holding 12 x 4 = 48 partitions of 10 %: the limit was reached
    assert rejected
    clear(daemon, "1")


def test_request_id_makes_retries_idempotent_under_concurrency(daemon: Daemon) -> None:
    set_mode(daemon, "2", pb.PARTITION_MODE_TDM)
    clear(daemon, "2")
    request = pb.CreatePartitionRequest(owner=lease(), gpu="2", compute_percent=30, request_id="retry-1")
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: stub(daemon.admin).CreatePartition(request, timeout=20).id, range(8)))
    assert len(ids) == 1
    other = pb.CreatePartitionRequest(owner=lease(), gpu="2", compute_percent=40, request_id="retry-1")
    assert code_of(stub(daemon.admin).CreatePartition, other) == grpc.StatusCode.ALREADY_EXISTS
    clear(daemon, "2")


def test_the_docs_retry_with_a_process_owner_returns_the_same_partition(daemon: Daemon) -> None:
    """docs/partitioning.md's `--owner-pid $$ --request-id job-17`: the daemon adds the process's start time to the
    owner it stores, but a retry is compared with what the caller sent, so it gets the same partition."""
    set_mode(daemon, "2", pb.PARTITION_MODE_TDM)
    clear(daemon, "2")
    owner = pb.Owner(process=pb.ProcessOwner(pid=os.getpid()))
    request = pb.CreatePartitionRequest(owner=owner, gpu="2", compute_percent=20, request_id="job-17")
    first = stub(daemon.admin).CreatePartition(request, timeout=20)
    again = stub(daemon.admin).CreatePartition(request, timeout=20)
    assert again.id == first.id and again.state == first.state
    changed = pb.CreatePartitionRequest(owner=owner, gpu="2", compute_percent=30, request_id="job-17")
    assert code_of(stub(daemon.admin).CreatePartition, changed) == grpc.StatusCode.ALREADY_EXISTS
    clear(daemon, "2")


def test_read_socket_refuses_writes(daemon: Daemon) -> None:
    reader = stub(daemon.read)
    create = pb.CreatePartitionRequest(owner=lease(), gpu="1", compute_percent=10)
    assert code_of(reader.CreatePartition, create) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(reader.DeletePartition, pb.DeletePartitionRequest(id="x")) == grpc.StatusCode.PERMISSION_DENIED
    mode = pb.SetCardModeRequest(gpu="0", mode=pb.PARTITION_MODE_TDM)
    assert code_of(reader.SetCardMode, mode) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(reader.RenewLease, pb.RenewLeaseRequest(id="x")) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(reader.GetCapacity, pb.GetCapacityRequest()) == grpc.StatusCode.OK
    assert Path(daemon.admin[len("unix:") :]).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"gpu": "1", "compute_percent": 101}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "1", "memory": "100MiB"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "1", "memory": "8GB"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "1", "memory": "141GiB"}, grpc.StatusCode.INVALID_ARGUMENT),  # more than the card has
        ({"gpu": "", "compute_percent": 10}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "99", "compute_percent": 10}, grpc.StatusCode.NOT_FOUND),
        ({"gpu": "GPU-nope", "compute_percent": 10}, grpc.StatusCode.NOT_FOUND),
        ({"gpu": "0", "compute_percent": 10}, grpc.StatusCode.FAILED_PRECONDITION),  # mode none
        ({"gpu": "3", "compute_percent": 10, "owner": None}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "3", "owner": pb.Owner(process=pb.ProcessOwner(pid=-4))}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "3", "owner": pb.Owner(process=pb.ProcessOwner(pid=4194304))}, grpc.StatusCode.FAILED_PRECONDITION),
        ({"gpu": "3", "owner": pb.Owner(process=pb.ProcessOwner(pid=2**31 - 1))}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"gpu": "3", "owner": pb.Owner(container=pb.ContainerOwner(id="XYZ"))}, grpc.StatusCode.INVALID_ARGUMENT),
        (
            {"gpu": "3", "owner": pb.Owner(container=pb.ContainerOwner(id="a" * 64, cgroup_path="../../etc"))},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            {"gpu": "3", "owner": pb.Owner(pod=pb.PodOwner(namespace="Bad_NS", name="p", container="c"))},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        ({"gpu": "3", "owner": pb.Owner(lease=pb.LeaseOwner(holder=""))}, grpc.StatusCode.INVALID_ARGUMENT),
        (
            {"gpu": "3", "owner": pb.Owner(lease=pb.LeaseOwner(holder="h", ttl_seconds=-1))},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            {"gpu": "3", "owner": pb.Owner(lease=pb.LeaseOwner(holder="h", ttl_seconds=float("nan")))},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        ({"gpu": "6", "compute_percent": 0}, grpc.StatusCode.INVALID_ARGUMENT),  # MIG needs a size
    ],
)
def test_invalid_requests_get_the_right_status(daemon: Daemon, fields: dict[str, Any], code: grpc.StatusCode) -> None:
    set_mode(daemon, "3", pb.PARTITION_MODE_TDM)
    set_mode(daemon, "6", pb.PARTITION_MODE_MIG)
    fields = dict(fields)
    owner = fields.pop("owner", lease())
    request = pb.CreatePartitionRequest(**fields)
    if owner is not None:
        request.owner.CopyFrom(owner)
    assert code_of(stub(daemon.admin).CreatePartition, request) == code


def test_other_calls_statuses(daemon: Daemon) -> None:
    s = stub(daemon.admin)
    assert code_of(s.GetPartition, pb.GetPartitionRequest(id="p-nothere")) == grpc.StatusCode.NOT_FOUND
    assert s.DeletePartition(pb.DeletePartitionRequest(id="p-nothere"), timeout=20).deleted is False
    assert code_of(s.DeletePartition, pb.DeletePartitionRequest(id="")) == grpc.StatusCode.INVALID_ARGUMENT
    bad_mode = pb.SetCardModeRequest(gpu="0", mode=pb.PARTITION_MODE_UNSPECIFIED)
    assert code_of(s.SetCardMode, bad_mode) == grpc.StatusCode.INVALID_ARGUMENT
    mig_without_hw = pb.SetCardModeRequest(gpu="0", mode=pb.PARTITION_MODE_MIG)
    assert code_of(s.SetCardMode, mig_without_hw) == grpc.StatusCode.FAILED_PRECONDITION
    set_mode(daemon, "4", pb.PARTITION_MODE_TDM)
    p = s.CreatePartition(
        pb.CreatePartitionRequest(owner=pb.Owner(process=pb.ProcessOwner(pid=1)), gpu="4", compute_percent=5),
        timeout=20,
    )
    assert code_of(s.RenewLease, pb.RenewLeaseRequest(id=p.id)) == grpc.StatusCode.FAILED_PRECONDITION
    to_none = pb.SetCardModeRequest(gpu="4", mode=pb.PARTITION_MODE_NONE)
    assert code_of(s.SetCardMode, to_none) == grpc.StatusCode.FAILED_PRECONDITION
    s.DeletePartition(pb.DeletePartitionRequest(id=p.id), timeout=20)
    assert code_of(s.GetCapacity, pb.GetCapacityRequest(gpu="42")) == grpc.StatusCode.NOT_FOUND


owners = st.one_of(
    st.none(),
    st.builds(lambda h, t: pb.Owner(lease=pb.LeaseOwner(holder=h, ttl_seconds=t)), st.text(max_size=8), st.floats()),
    st.builds(lambda pid: pb.Owner(process=pb.ProcessOwner(pid=pid)), st.integers(-(2**31), 2**31 - 1)),
    st.builds(
        lambda i, c: pb.Owner(container=pb.ContainerOwner(id=i, cgroup_path=c)),
        st.text("0123456789abcdefXYZ", max_size=70),
        st.text(max_size=12),
    ),
    st.builds(
        lambda n, p, c: pb.Owner(pod=pb.PodOwner(namespace=n, name=p, container=c)),
        st.text(max_size=6),
        st.text(max_size=6),
        st.text(max_size=6),
    ),
)
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gpu=st.one_of(st.sampled_from(["0", "3", "5", "6", "any", "9", ""]), st.text(max_size=8)),
    compute=st.integers(0, 2**32 - 1),
    memory=st.one_of(st.sampled_from(["", "0", "1GiB", "128MiB", "20GiB", "100MiB", "7GB"]), st.text(max_size=10)),
    owner=owners,
    request_id=st.one_of(st.just(""), st.text(max_size=6)),
)
def test_arbitrary_requests_never_crash_or_overcommit(
    daemon: Daemon, gpu: str, compute: int, memory: str, owner: Any, request_id: str
) -> None:
    set_mode(daemon, "3", pb.PARTITION_MODE_TDM)
    set_mode(daemon, "5", pb.PARTITION_MODE_TDM)
    set_mode(daemon, "6", pb.PARTITION_MODE_MIG)
    request = pb.CreatePartitionRequest(gpu=gpu, compute_percent=compute, memory=memory, request_id=request_id)
    if owner is not None:
        request.owner.CopyFrom(owner)
    code = code_of(stub(daemon.admin).CreatePartition, request)
    assert code in ALLOWED
    if compute > 100 or owner is None:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    for card in stub(daemon.read).GetCapacity(pb.GetCapacityRequest(), timeout=20).cards:
        assert card.compute_percent_allocated <= 100
        assert card.memory_allocated_bytes <= card.memory_total_bytes
    if len(daemon.manager.list_partitions()) > 20:
        for g in ("3", "5", "6"):
            clear(daemon, g)
