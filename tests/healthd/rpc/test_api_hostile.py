"""Every RPC the daemon serves, called with valid-ish and hostile requests (and raw bytes) by hypothesis, through
real channels to one real daemon process (simulated backend) on its unix sockets: the main (read-only) socket and
the admin socket. Nothing may come back UNKNOWN or INTERNAL, no error may carry Python's exception text or grow
with the input, every status detail must decode, and the daemon must keep serving. The reference hook server
(`xpuctl hook serve`) gets the same treatment.

One daemon for the module (starting one per example would be most of the run time); the tests run in file order
and the last one checks the totals: at least 2,000 examples, and the daemon still up and answering.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2 as rpb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.backends.simulated import FAULT_PARAMS
from healthd.api.v1 import health_pb2 as hpb
from healthd.api.v1 import hook_pb2
from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import simulation_pb2 as spb
from healthd.api.v1 import topology_pb2 as tpb
from tests.support.daemon_process import DaemonProcess
from tests.support.hook_process import start_hook, stop_hook

pytestmark = pytest.mark.e2e
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
PYTHON_TEXT = ("Traceback", "Exception", "invalid literal", "Error parsing", "object has no attribute", "Errno")
DETAILS_KEY = "grpc-status-details-bin"

# ----- the daemon, its sockets, the tally --------------------------------------------------------------------


@dataclass
class Node:
    daemon: DaemonProcess
    main: grpc.Channel
    admin: grpc.Channel
    uuids: list[str]
    hook: grpc.Channel | None = None
    examples: dict[str, int] = field(default_factory=dict)  # hypothesis examples per RPC
    calls: int = 0  # calls made (an example is sent to both sockets where both serve the RPC)
    codes: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("api")
    daemon = DaemonProcess(tmp, interval=1.0, deadline=2.0).start()
    admin_path = tmp / "healthd-admin.sock"
    deadline = time.monotonic() + 60
    while not admin_path.exists():  # partitions start after the first sample
        assert time.monotonic() < deadline, daemon.log.read_text()
        time.sleep(0.1)
    main = grpc.insecure_channel(daemon.address)
    admin = grpc.insecure_channel(f"unix:{admin_path}")
    raw = main.unary_unary("/xpu.runtime.v1.Partitions/GetCapacity")(b"", timeout=30)
    uuids = [c.gpu_uuid for c in ppb.GetCapacityResponse.FromString(raw).cards]
    assert len(uuids) == 8
    yield Node(daemon, main, admin, uuids)
    main.close()
    admin.close()
    daemon.stop()


def check_failure(error: grpc.RpcError, method: str) -> grpc.StatusCode:
    """A failed call's status is clean: not UNKNOWN/INTERNAL, short, no Python text, details that decode."""
    err: Any = error
    code: grpc.StatusCode = err.code()
    details: str = err.details() or ""
    assert code not in FORBIDDEN, f"{method}: {code.name}: {details[:300]}"
    assert len(details) <= 1000, f"{method}: a {len(details)}-character error message"
    assert not any(marker in details for marker in PYTHON_TEXT), f"{method}: {details[:300]}"
    for key, value in err.trailing_metadata() or ():
        if key == DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            assert status.code == code.value[0]
            assert status.message == details
            info = error_details_pb2.ErrorInfo()
            assert any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR)), f"{method}: no ErrorInfo"
            assert info.domain == "xpu-runtime-kit.io" and info.reason.isupper()
    return code


def tally(node: Node, name: str, code: grpc.StatusCode) -> None:
    node.calls += 1
    node.codes[code.name] = node.codes.get(code.name, 0) + 1


def unary(node: Node, channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    try:
        channel.unary_unary(method)(payload, timeout=30)
    except grpc.RpcError as error:
        return check_failure(error, method)
    return grpc.StatusCode.OK


def first_of_stream(channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    """A server stream that may run forever (WatchFaults, Health.Watch): its first message or error, then cancel."""
    stream: Any = channel.unary_stream(method)(payload, timeout=2)
    try:
        next(stream)
    except StopIteration:
        return grpc.StatusCode.OK
    except grpc.RpcError as error:
        code = check_failure(error, method)
        assert code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND), code  # fmt: skip
        return code
    finally:
        stream.cancel()
    return grpc.StatusCode.OK


def bidi(channel: grpc.Channel, method: str, payloads: list[bytes]) -> grpc.StatusCode:
    try:
        for _ in channel.stream_stream(method)(iter(payloads), timeout=30):
            pass
    except grpc.RpcError as error:
        return check_failure(error, method)
    return grpc.StatusCode.OK


# ----- strategies ---------------------------------------------------------------------------------------------

HOSTILE = [
    "", "²", "٣", "1" * 5000, "x" * 20000, "GPU-" + "a" * 20000, "0", "3", "6", "7", "8", "65536", "99999999999",
    "any", " 3 ", "-1", "+1", "1_0", "03", "0x3", "3\n", "\x00", "GPU-", "p-000000000000", "8GiB", "128MiB", "7GB",
    "1" * 5000 + "GiB", "٣GiB", "a" * 64, "../..", "NaN",
]  # fmt: skip
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
DIGITS = st.text("0123456789٣²¹", min_size=1, max_size=8)
UINT32 = st.one_of(st.integers(0, 12), st.just(2**32 - 1), st.integers(0, 2**32 - 1))
UINT64 = st.one_of(st.integers(0, 12), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
INT32 = st.one_of(
    st.integers(-2, 12), st.sampled_from([-(2**31), 2**31 - 1, 4194304]), st.integers(-(2**31), 2**31 - 1)
)
FLOATS = st.one_of(st.sampled_from([0.0, 1.0, 60.0, -1.0, float("nan"), float("inf")]), st.floats())
ENUM = st.integers(-3, 8)
RAW = st.one_of(st.just(b"\xff\xff\xff"), st.binary(max_size=64))


def text(node: Node, *extra: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([*HOSTILE, *node.uuids, *extra]), TEXT, DIGITS)


def owners(node: Node) -> st.SearchStrategy[Any]:
    t = text(node, "default", "main", "0123456789ab", "0123456789abcdef" * 4)
    return st.one_of(
        st.none(),
        st.builds(lambda h, s: ppb.Owner(lease=ppb.LeaseOwner(holder=h, ttl_seconds=s)), text(node, "h"), FLOATS),
        st.builds(lambda pid: ppb.Owner(process=ppb.ProcessOwner(pid=pid)), INT32),
        st.builds(lambda i, c: ppb.Owner(container=ppb.ContainerOwner(id=i, cgroup_path=c)), t, t),
        st.builds(lambda n, p, c: ppb.Owner(pod=ppb.PodOwner(namespace=n, name=p, container=c)), t, t, t),
    )


def create_partition(node: Node) -> st.SearchStrategy[Any]:
    def build(owner: Any, gpu: str, compute: int, memory: str, request_id: str) -> Any:
        request = ppb.CreatePartitionRequest(gpu=gpu, compute_percent=compute, memory=memory, request_id=request_id)
        if owner is not None:
            request.owner.CopyFrom(owner)
        return request

    hostile = st.builds(
        build,
        owners(node),
        text(node),
        st.one_of(st.integers(0, 100), UINT32),
        text(node, "1GiB", "256MiB"),
        st.one_of(st.just(""), text(node)),
    )
    valid = st.builds(
        build,
        st.builds(
            lambda t: ppb.Owner(lease=ppb.LeaseOwner(holder="hypothesis", ttl_seconds=t)), st.sampled_from([0, 60])
        ),
        st.sampled_from(["any", "3", "5", "6", node.uuids[3], node.uuids[6]]),
        st.integers(0, 60),
        st.sampled_from(["", "0", "1GiB", "256MiB", "10GiB"]),
        st.one_of(st.just(""), st.sampled_from(["r1", "r2"])),
    )
    return st.one_of(valid, hostile)


def set_card_mode(node: Node) -> st.SearchStrategy[Any]:
    valid = st.builds(
        lambda g, m: ppb.SetCardModeRequest(gpu=g, mode=m), st.sampled_from(["0", "3", "5", "6"]), st.integers(1, 3)
    )
    hostile = st.builds(lambda g, m: ppb.SetCardModeRequest(gpu=g, mode=m), text(node), ENUM)
    return st.one_of(valid, hostile)


LIVE = ppb.GetPartitionRequest(id="<a live partition, chosen at call time>")


def partition_ids(node: Node) -> st.SearchStrategy[str]:
    return st.one_of(st.just(LIVE.id), text(node))


def live_partition(node: Node) -> str:
    raw = node.main.unary_unary("/xpu.runtime.v1.Partitions/ListPartitions")(b"", timeout=30)
    ids = [p.id for p in ppb.ListPartitionsResponse.FromString(raw).partitions]
    return ids[len(ids) // 2] if ids else "p-000000000000"


def inject_fault(node: Node) -> st.SearchStrategy[Any]:
    kinds = sorted(set(FAULT_PARAMS) - {"hang"})  # a hang stalls the card's calls until cleared: not hostile input
    params = st.dictionaries(
        st.one_of(st.sampled_from(sorted({p for ps in FAULT_PARAMS.values() for p in ps})), TEXT),
        st.one_of(st.sampled_from(["1", "79", "0", "0.5", "2", "p", "999999999999", "٣", "1" * 5000]), TEXT),
        max_size=4,
    )
    kind = st.one_of(st.sampled_from(kinds), text(node)).filter(lambda k: k != "hang")
    return st.builds(lambda k, g, p: spb.InjectFaultRequest(kind=k, gpu=g, params=p), kind, UINT32, params)


def reflection_request(node: Node) -> st.SearchStrategy[Any]:
    symbol = text(node, "xpu.runtime.v1.Partitions", "grpc.reflection.v1.ServerReflection", "xpu.runtime.v1.Fault")
    return st.one_of(
        st.builds(lambda s: rpb.ServerReflectionRequest(list_services=s), symbol),
        st.builds(lambda s: rpb.ServerReflectionRequest(file_containing_symbol=s), symbol),
        st.builds(lambda s: rpb.ServerReflectionRequest(file_by_filename=s), symbol),
        st.builds(lambda s: rpb.ServerReflectionRequest(all_extension_numbers_of_type=s), symbol),
        st.builds(
            lambda s, n: rpb.ServerReflectionRequest(
                file_containing_extension=rpb.ExtensionRequest(containing_type=s, extension_number=n)
            ),
            symbol,
            INT32,
        ),
        st.just(rpb.ServerReflectionRequest()),
    )


@dataclass(frozen=True)
class Rpc:
    method: str
    requests: Callable[[Node], st.SearchStrategy[Any]]
    examples: int = 120
    sockets: tuple[str, ...] = ("main", "admin")
    shape: str = "unary"  # unary, server_stream, bidi


P, H = "/xpu.runtime.v1.Partitions/", "/xpu.runtime.v1.Health/"
T, S = "/xpu.runtime.v1.Topology/", "/xpu.runtime.v1.Simulation/"
RPCS = [
    Rpc(P + "SetCardMode", set_card_mode),
    Rpc(P + "CreatePartition", create_partition, examples=250),
    Rpc(P + "GetPartition", lambda n: st.builds(lambda i: ppb.GetPartitionRequest(id=i), partition_ids(n))),
    Rpc(P + "ListPartitions", lambda n: st.builds(lambda g: ppb.ListPartitionsRequest(gpu=g), text(n))),
    Rpc(P + "DeletePartition", lambda n: st.builds(lambda i: ppb.DeletePartitionRequest(id=i), partition_ids(n))),
    Rpc(
        P + "RenewLease",
        lambda n: st.builds(lambda i, t: ppb.RenewLeaseRequest(id=i, ttl_seconds=t), partition_ids(n), FLOATS),
    ),
    Rpc(P + "GetCapacity", lambda n: st.builds(lambda g: ppb.GetCapacityRequest(gpu=g), text(n))),
    Rpc(H + "GetNodeHealth", lambda n: st.just(hpb.GetNodeHealthRequest()), examples=60, sockets=("main",)),
    Rpc(
        H + "ListFaults",
        lambda n: st.builds(
            lambda g, c, s, sev, a, since, lim: hpb.ListFaultsRequest(
                gpu=g, check=c, state=s, min_severity=sev, min_action=a, since_seq=since, limit=lim
            ),
            text(n),
            text(n, "xid", "ecc"),
            ENUM,
            ENUM,
            ENUM,
            UINT64,
            UINT32,
        ),
        examples=200,
        sockets=("main",),
    ),
    Rpc(
        H + "WatchFaults",
        lambda n: st.builds(lambda a: hpb.WatchFaultsRequest(after_seq=a), UINT64),
        examples=60,
        sockets=("main",),
        shape="server_stream",
    ),
    Rpc(T + "Get", lambda n: st.just(tpb.GetTopologyRequest()), examples=60, sockets=("main",)),
    Rpc(
        T + "PreferredAllocation",
        lambda n: st.builds(
            lambda c, a, m: tpb.PreferredAllocationRequest(count=c, available=a, must_include=m),
            UINT32,
            st.lists(text(n), max_size=4),
            st.lists(text(n), max_size=3),
        ),
        examples=200,
        sockets=("main",),
    ),
    Rpc(S + "InjectFault", inject_fault, examples=200, sockets=("admin",)),
    Rpc(
        S + "ClearFaults",
        lambda n: st.one_of(
            st.just(spb.ClearFaultsRequest()), st.builds(lambda g: spb.ClearFaultsRequest(gpu=g), UINT32)
        ),
        examples=60,
        sockets=("admin",),
    ),
    Rpc(S + "ListFaultKinds", lambda n: st.just(spb.ListFaultKindsRequest()), examples=40, sockets=("main",)),
    Rpc(
        "/grpc.health.v1.Health/Check",
        lambda n: st.builds(lambda s: health_pb2.HealthCheckRequest(service=s), text(n, "xpu.runtime.v1.Health")),
        examples=60,
    ),
    Rpc(
        "/grpc.health.v1.Health/Watch",
        lambda n: st.builds(lambda s: health_pb2.HealthCheckRequest(service=s), text(n, "")),
        examples=40,
        sockets=("main",),
        shape="server_stream",
    ),
    Rpc("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", reflection_request, examples=100, shape="bidi"),
    Rpc(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        reflection_request,
        examples=60,
        sockets=("main",),
        shape="bidi",
    ),
]


@pytest.mark.parametrize("rpc", RPCS, ids=[r.method.rsplit(".", 1)[-1] for r in RPCS])
def test_rpc_never_answers_unknown_or_internal(node: Node, rpc: Rpc) -> None:
    payload = st.one_of(rpc.requests(node).map(lambda m: m.SerializeToString()), RAW)
    if rpc.shape == "bidi":
        payload = st.lists(payload, min_size=1, max_size=3)  # type: ignore[assignment]

    @settings(max_examples=rpc.examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=payload)
    def check(data: Any) -> None:
        node.examples[rpc.method] = node.examples.get(rpc.method, 0) + 1
        if isinstance(data, bytes) and LIVE.id.encode() in data:  # the id field of Get/Delete/RenewLease
            data = data.replace(LIVE.id.encode(), live_partition(node).encode())
        for name in rpc.sockets:
            channel = node.main if name == "main" else node.admin
            if rpc.shape == "unary":
                code = unary(node, channel, rpc.method, data)
            elif rpc.shape == "server_stream":
                code = first_of_stream(channel, rpc.method, data)
            else:
                code = bidi(channel, rpc.method, data)
            tally(node, rpc.method, code)

    check()
    assert node.daemon.proc is not None and node.daemon.proc.poll() is None, "the daemon died"


# ----- the reference hook -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    tmp = tmp_path_factory.mktemp("hook")
    sock = tmp / "hook.sock"
    proc = start_hook(f"unix:{sock}", "cat >/dev/null", tmp / "hook.sqlite", log_level="error")
    channel = grpc.insecure_channel(f"unix:{sock}")
    grpc.channel_ready_future(channel).result(timeout=60)
    yield channel
    channel.close()
    assert stop_hook(proc) == 0


def test_hook_never_answers_unknown_or_internal(node: Node, hook: grpc.Channel) -> None:
    t = text(node)
    reports = st.builds(
        lambda key, node_name, seq, gpu, message, evidence, first, fault_json: hook_pb2.FaultReport(
            idempotency_key=key, fault_id=key, node_name=node_name, seq=seq, gpu_index=gpu, message=message,
            evidence=evidence, first_seen=first, fault_json=fault_json,
        ),
        t, t, UINT64, INT32, t, st.dictionaries(t, t, max_size=3), FLOATS,
        st.one_of(st.sampled_from(["", "{}", "[" * 100000, "{" + '"a":' * 5000]), t),
    )  # fmt: skip
    method = "/xpu.runtime.v1.ReplacementHook/ReportFault"

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.one_of(reports.map(lambda m: m.SerializeToString()), RAW))
    def check(data: bytes) -> None:
        node.examples[method] = node.examples.get(method, 0) + 1
        tally(node, method, unary(node, hook, method, data))

    check()


def test_totals_and_the_daemon_still_serves(node: Node) -> None:
    if len(node.examples) < len(RPCS) + 1:
        pytest.skip("runs after every RPC test of this module (not selected on its own)")
    total = sum(node.examples.values())
    print(f"\nhostile API: {total} examples, {node.calls} calls over {len(node.examples)} RPCs; codes: {node.codes}")
    assert total >= 2000
    assert node.daemon.proc is not None and node.daemon.proc.poll() is None
    reply = node.main.unary_unary("/xpu.runtime.v1.Partitions/GetCapacity")(b"", timeout=30)
    assert len(ppb.GetCapacityResponse.FromString(reply).cards) == 8
    assert node.daemon.get("/healthz")[0] == 200
    assert "rpc handler failed" not in node.daemon.log.read_text()  # the guard's log line for an unexpected error
