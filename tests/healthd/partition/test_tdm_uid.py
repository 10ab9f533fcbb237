"""One uid per card in TDM sharing "shared", through real gRPC on unix sockets (and across a restart).

A shared card has one MPS control daemon, and the control daemon runs one server at a time per uid: a client of a
second uid waits, without an error, until every process of the first has exited (nvidia-cuda-mps-control(1)). So a
partition for a second uid on such a card is refused with FAILED_PRECONDITION naming both uids, never queued.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.manager import CreateRequest
from healthd.partition.model import CardMode, Owner, OwnerKind
from healthd.partition.sharing import SharingPolicy
from healthd.partition.store import Store
from tests.support.partition_node import Daemon, Node

SHARED, ISOLATED = "3", "4"


def stub(address: str) -> Any:
    return pb_grpc.PartitionsStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]


def create(d: Daemon, gpu: str, uid: int | None = None, compute: int = 10) -> Any:
    request = pb.CreatePartitionRequest(owner=pb.Owner(lease=pb.LeaseOwner(holder="uid-test")), gpu=gpu, memory="1GiB")
    request.compute_percent = compute
    if uid is not None:
        request.client_uid = uid
    return stub(d.admin).CreatePartition(request, timeout=20)


def refused(d: Daemon, gpu: str, uid: int | None = None) -> tuple[grpc.StatusCode, str, str]:
    """(code, message, ErrorInfo reason) of a create that must fail."""
    with pytest.raises(grpc.RpcError) as err:
        create(d, gpu, uid)
    error: Any = err.value
    status = rpc_status.from_call(error)
    assert status is not None
    reason = ""
    for holder in status.details:
        if holder.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            holder.Unpack(info)
            reason = info.reason
    return error.code(), error.details(), reason


def card(d: Daemon, gpu: str, sharing: int) -> None:
    s = stub(d.admin)
    for p in s.ListPartitions(pb.ListPartitionsRequest(gpu=gpu), timeout=20).partitions:
        s.DeletePartition(pb.DeletePartitionRequest(id=p.id), timeout=20)
    mode = pb.PARTITION_MODE_NONE if sharing < 0 else pb.PARTITION_MODE_TDM
    s.SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=pb.PARTITION_MODE_NONE), timeout=20)
    s.SetCardMode(pb.SetCardModeRequest(gpu=gpu, mode=mode, sharing=max(sharing, 0)), timeout=20)


def test_a_shared_card_serves_one_uid(daemon: Daemon) -> None:
    card(daemon, SHARED, pb.TDM_SHARING_SHARED)
    first = create(daemon, SHARED, uid=1000)
    assert first.HasField("client_uid") and first.client_uid == 1000
    code, message, reason = refused(daemon, SHARED, uid=2000)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PARTITION_PRECONDITION")
    assert "uid 2000" in message and "uid 1000" in message and first.id in message
    assert "tdm sharing shared" in message
    same = create(daemon, SHARED, uid=1000)  # the same uid: clients of the one server, side by side
    assert same.client_uid == 1000
    code, message, _ = refused(daemon, SHARED)  # no uid given: it could be any
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "client_uid 1000" in message
    got = stub(daemon.read).GetPartition(pb.GetPartitionRequest(id=first.id), timeout=20)
    assert got.client_uid == 1000
    for p in (first, same):
        stub(daemon.admin).DeletePartition(pb.DeletePartitionRequest(id=p.id), timeout=20)
    assert create(daemon, SHARED, uid=2000).client_uid == 2000, "an empty card takes any uid"


def test_a_shared_card_whose_partitions_give_no_uid_refuses_one_that_does(daemon: Daemon) -> None:
    card(daemon, SHARED, pb.TDM_SHARING_SHARED)
    unknown = create(daemon, SHARED)
    assert not unknown.HasField("client_uid")
    create(daemon, SHARED)  # none given, again: the creator's word that they share one uid
    code, message, _ = refused(daemon, SHARED, uid=0)
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert unknown.id in message and "uid 0" in message


def test_an_isolated_card_takes_partitions_of_any_uid(daemon: Daemon) -> None:
    card(daemon, ISOLATED, pb.TDM_SHARING_ISOLATED)
    a, b, c = create(daemon, ISOLATED, uid=1000), create(daemon, ISOLATED, uid=2000), create(daemon, ISOLATED)
    assert (a.client_uid, b.client_uid, c.HasField("client_uid")) == (1000, 2000, False)


def test_any_card_skips_the_shared_card_of_another_uid_and_says_why_when_none_is_left(daemon: Daemon) -> None:
    card(daemon, SHARED, pb.TDM_SHARING_SHARED)
    card(daemon, ISOLATED, pb.TDM_SHARING_ISOLATED)
    for gpu in ("0", "1", "2", "5", "7"):  # cards other tests of this module may have left in a mode
        card(daemon, gpu, -1)
    create(daemon, SHARED, uid=1000, compute=80)
    assert create(daemon, "any", uid=2000).gpu == int(ISOLATED)
    card(daemon, ISOLATED, -1)
    code, message, _ = refused(daemon, "any", uid=2000)
    assert code is grpc.StatusCode.FAILED_PRECONDITION, "refused for its uid, not RESOURCE_EXHAUSTED"
    assert "uid 2000" in message and "uid 1000" in message


def test_the_uid_that_means_no_uid_is_invalid(daemon: Daemon) -> None:
    card(daemon, ISOLATED, pb.TDM_SHARING_ISOLATED)
    with pytest.raises(grpc.RpcError) as err:
        create(daemon, ISOLATED, uid=0xFFFFFFFF)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "client_uid" in str(err.value.details())


def test_the_uid_is_kept_across_a_restart_and_still_holds_the_card(make_node: Callable[[str], Node]) -> None:
    async def go() -> None:
        node = make_node("h200x8")
        owner = Owner(OwnerKind.LEASE, holder="t")
        m = node.manager()
        await m.start()
        await m.set_mode("2", CardMode.TDM, SharingPolicy.SHARED)
        kept = await m.create(CreateRequest(owner=owner, gpu="2", compute_percent=20, memory_mib=1024, client_uid=7))
        again = node.manager()  # the daemon restarted: the state file is all it has
        await again.start()
        assert again.get(kept.id).client_uid == 7
        with pytest.raises(PartitionError) as err:
            await again.create(CreateRequest(owner=owner, gpu="2", compute_percent=20, memory_mib=1024, client_uid=8))
        assert err.value.kind is Kind.PRECONDITION and "uid 7" in err.value.message

    asyncio.run(go())


def test_a_state_file_from_before_client_uids_opens_with_none_given(tmp_path: Path) -> None:
    """The partitions table of the previous release had no client_uid column: it is added, its rows read as None."""
    path = tmp_path / "partitions.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
        db.execute(
            "INSERT INTO partitions(id, gpu, gpu_uuid, mode, compute_percent, memory_mib, owner, state, created_at)"
            " VALUES('p-old', 0, 'GPU-0', 'tdm', 30, 1024, ?, 'ready', 1.0)",
            ('{"kind": "lease", "holder": "h"}',),
        )
    db.close()
    store = Store(path)
    try:
        (old,) = store.all()
        assert old.id == "p-old" and old.client_uid is None
    finally:
        store.close()


OLD_SCHEMA = """
CREATE TABLE cards (gpu_uuid TEXT PRIMARY KEY, mode TEXT NOT NULL, sharing TEXT NOT NULL DEFAULT '');
CREATE TABLE partitions (
    id TEXT PRIMARY KEY, gpu INTEGER NOT NULL, gpu_uuid TEXT NOT NULL, mode TEXT NOT NULL,
    compute_percent INTEGER NOT NULL, memory_mib INTEGER NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, lease_expires_at REAL NOT NULL DEFAULT 0, request_id TEXT,
    request_fingerprint TEXT NOT NULL DEFAULT '', mig TEXT
);
"""
