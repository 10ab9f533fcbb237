"""Topology gRPC service with a real grpc.aio server on a unix socket and real client channels; xpuctl against it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.topology.matrix import render_matrix
from exporter.topology.model import Topology
from exporter.topology.refresher import RefreshStatus
from healthd import cli
from healthd.api.v1 import topology_pb2 as pb
from healthd.api.v1 import topology_pb2_grpc as pb_grpc
from healthd.rpc.server import GrpcServer, Service
from healthd.topology.component import _add_topology
from healthd.topology.service import TopologyService, topology_from_pb, topology_to_pb
from tests.support.topology_fixtures import fixture_topology


class Server:
    """A GrpcServer with the Topology service on its own event loop thread."""

    def __init__(self, socket: Path, latest: Callable[[], Topology | None]) -> None:
        status = RefreshStatus(1, 1, 0, "GPU inventory not known yet", None)
        service = TopologyService(latest, lambda: status)
        self.address = f"unix:{socket}"
        self.server = GrpcServer([self.address], [Service("xpu.runtime.v1.Topology", service, _add_topology)])
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.1), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def hgx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    topology = fixture_topology("hgx_nvswitch")
    with Server(tmp_path_factory.mktemp("sock") / "healthd.sock", lambda: topology) as server:
        yield server


@pytest.fixture
def stub(hgx_server: Server) -> Iterator[pb_grpc.TopologyStub]:
    with grpc.insecure_channel(hgx_server.address) as channel:
        yield pb_grpc.TopologyStub(channel)  # type: ignore[no-untyped-call]


def test_get_returns_the_whole_graph(stub: pb_grpc.TopologyStub) -> None:
    reply = stub.Get(pb.GetTopologyRequest(), timeout=10)
    assert len(reply.gpus) == 8
    assert len(reply.nics) == 8
    assert len(reply.gpu_links) == 64
    assert len(reply.nic_links) == 64
    link = next(m for m in reply.gpu_links if m.a == "GPU0" and m.b == "GPU7")
    assert (link.label, link.nvlinks, link.kind) == ("NV18", 18, pb.LINK_KIND_NVLINK)
    nic = next(m for m in reply.nic_links if m.a == "GPU0" and m.b == "mlx5_4")
    assert nic.label == "SYS"
    assert reply.gpus[4].location.numa_node == 1
    assert reply.gpus[4].location.pcie_switch == "0000:98:00.0"


def test_round_trip_renders_the_same_matrix() -> None:
    topology = fixture_topology("pcie_switch_8gpu")
    assert render_matrix(topology_from_pb(topology_to_pb(topology))) == render_matrix(topology)


def test_preferred_allocation_by_index_and_uuid(stub: pb_grpc.TopologyStub) -> None:
    reply = stub.PreferredAllocation(pb.PreferredAllocationRequest(count=2, must_include=["GPU-hgx_-6"]), timeout=10)
    assert list(reply.gpus) == [6, 7]
    assert list(reply.uuids) == ["GPU-hgx_-6", "GPU-hgx_-7"]
    assert [(n.name, n.level) for n in reply.nics[:2]] == [("mlx5_6", "pcie_switch"), ("mlx5_7", "pcie_switch")]
    assert reply.worst_link == "NV18"
    assert reply.exact
    reply = stub.PreferredAllocation(
        pb.PreferredAllocationRequest(count=4, available=["0", "1", "4", "5", "6", "7"]), timeout=10
    )
    assert list(reply.gpus) == [4, 5, 6, 7]


@pytest.mark.parametrize(
    ("request_kwargs", "code"),
    [
        ({"count": 0}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"count": 9}, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ({"count": 2, "available": ["0", "1"], "must_include": ["3"]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"count": 1, "must_include": ["0", "1"]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"count": 1, "available": ["GPU-unknown"]}, grpc.StatusCode.NOT_FOUND),
        ({"count": 1, "available": ["42"]}, grpc.StatusCode.NOT_FOUND),
        ({"count": 1, "available": ["mlx5_0"]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"count": 1, "available": ["1"] * 2000}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_requests_get_the_right_status(
    stub: pb_grpc.TopologyStub, request_kwargs: dict[str, object], code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.PreferredAllocation(pb.PreferredAllocationRequest(**request_kwargs), timeout=10)
    assert info.value.code() == code  # type: ignore[attr-defined]


_ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _ok(stub: pb_grpc.TopologyStub, request: pb.PreferredAllocationRequest) -> bool:
    """Whether the call succeeds; a failure must carry one of the statuses a caller can act on."""
    try:
        stub.PreferredAllocation(request, timeout=10)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        if code not in _ALLOWED:
            raise AssertionError(f"unexpected status {code}") from exc
        return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(0, 20),
    available=st.lists(st.one_of(st.integers(0, 12).map(str), st.text(max_size=12)), max_size=10),
    must=st.lists(st.one_of(st.integers(0, 12).map(str), st.just("GPU-hgx_-3")), max_size=4),
)
def test_any_request_gets_an_answer_or_a_clean_error(
    stub: pb_grpc.TopologyStub, count: int, available: list[str], must: list[str]
) -> None:
    request = pb.PreferredAllocationRequest(count=count, available=available, must_include=must)
    reply, call = stub.PreferredAllocation.with_call(request, timeout=10) if _ok(stub, request) else (None, None)
    if reply is not None:
        assert call is not None
        assert len(reply.gpus) == count
    # the server is still serving
    assert len(stub.Get(pb.GetTopologyRequest(), timeout=10).gpus) == 8


def test_unavailable_until_collected(tmp_path: Path) -> None:
    with Server(tmp_path / "s.sock", lambda: None) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TopologyStub(channel)  # type: ignore[no-untyped-call]
        for call, request in (
            (stub.Get, pb.GetTopologyRequest()),
            (stub.PreferredAllocation, pb.PreferredAllocationRequest(count=1)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            assert "GPU inventory not known yet" in info.value.details()  # type: ignore[attr-defined]


@pytest.mark.parametrize("gpu", ["²", "٣", "1" * 5000])
def test_a_malformed_id_is_invalid_argument_before_the_topology_is_known(tmp_path: Path, gpu: str) -> None:
    """Bad input is the caller's error whatever the daemon's state: checked before waiting for the topology."""
    with Server(tmp_path / "s.sock", lambda: None) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TopologyStub(channel)  # type: ignore[no-untyped-call]
        for request in (
            pb.PreferredAllocationRequest(count=1, available=[gpu]),
            pb.PreferredAllocationRequest(count=1, must_include=[gpu]),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.PreferredAllocation(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_xpuctl_topology_prints_the_matrix(hgx_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--socket", hgx_server.address, "topology"]) == 0
    assert capsys.readouterr().out == render_matrix(fixture_topology("hgx_nvswitch"))


def test_xpuctl_topology_preferred(hgx_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--socket", hgx_server.address, "topology", "--preferred", "2", "--must-include", "3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["GPUs:", "2,3"]
    assert out.splitlines()[5].split()[0] == "mlx5_2"  # the first NIC, below the table's header
    assert cli.main(["--socket", hgx_server.address, "topology", "--preferred", "9"]) == cli.EXIT_RPC
    assert "RESOURCE_EXHAUSTED" in capsys.readouterr().err


def test_xpuctl_topology_is_deadline_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A socket that accepts nothing: xpuctl gives up after --timeout instead of hanging.
    assert cli.main(["--socket", f"unix:{tmp_path}/none.sock", "--timeout", "0.5", "topology"]) == cli.EXIT_RPC
    assert "xpuctl:" in capsys.readouterr().err
