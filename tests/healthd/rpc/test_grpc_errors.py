"""The cases of issue 16, one by one, against a real daemon process (simulated node) on its unix sockets: GPU
references in non-ASCII digits or with 5,000 digits, 20,000-character inputs, corrupt protobuf bytes; and the
google.rpc.Status details a client in another language reads (decoded here with grpcio-status, not our code)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from exporter.topology.refresher import RefreshStatus
from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from healthd.api.v1 import simulation_pb2 as spb
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc
from healthd.api.v1 import topology_pb2 as tpb
from healthd.api.v1 import topology_pb2_grpc as tpb_grpc
from healthd.rpc.server import GrpcServer, Service
from healthd.rpc.validation import InvalidField, parse_ascii_uint, parse_gpu_ref, quote
from healthd.sim.service import SimulationService
from healthd.topology.component import _add_topology
from healthd.topology.service import TopologyService
from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

ROOT = REPO


# ----- the helpers, directly ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["²", "٣", "1" * 5000, "-1", "+1", "1_0", "0x3", "3.0", "", " "])
def test_only_ascii_digits_make_a_number(text: str) -> None:
    with pytest.raises(InvalidField) as err:
        parse_ascii_uint(text, "gpu", maximum=65535)
    assert err.value.field == "gpu"
    assert len(str(err.value)) < 200


def test_gpu_references() -> None:
    assert parse_gpu_ref(" 3 ").index == 3
    assert parse_gpu_ref("007").index == 7
    assert parse_gpu_ref("GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f50").uuid == "GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f50"
    assert parse_gpu_ref("any", allow_any=True).any
    for bad in ("٣", "²", "any", "MIG-1234", "3,4", "GPU-" + "a" * 100, "65536"):
        with pytest.raises(InvalidField):
            parse_gpu_ref(bad)


def test_quote_is_bounded() -> None:
    assert quote("abc") == "'abc'"
    long = quote("x" * 20000)
    assert long.endswith("... (20000 characters)")
    assert len(long) < 140
    assert quote("\x1b[31m") == repr("\x1b[31m")  # escapes stay escaped: nothing reaches a terminal or log raw


# ----- a real daemon ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("errors")
    with DaemonProcess(tmp, interval=1.0, deadline=2.0) as d:
        deadline = time.monotonic() + 60
        while not (tmp / "healthd-admin.sock").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield d


@pytest.fixture(scope="module")
def main(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def admin(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{daemon.tmp / 'healthd-admin.sock'}") as channel:
        yield channel


def failure(call: Any, request: Any) -> tuple[grpc.StatusCode, str, dict[str, Any]]:
    """(code, message, {detail type: message}) of a call that must fail; details decoded by grpcio-status."""
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=30)
    error: Any = err.value
    status = rpc_status.from_call(error)
    assert status is not None, f"{error.code().name} without google.rpc.Status details: {error.details()}"
    details: dict[str, Any] = {}
    for holder in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.ResourceInfo):
            if holder.Is(cls.DESCRIPTOR):
                details[cls.DESCRIPTOR.name] = cls()
                holder.Unpack(details[cls.DESCRIPTOR.name])
    assert details["ErrorInfo"].domain == "xpu-runtime-kit.io"
    return error.code(), error.details(), details


@pytest.mark.parametrize("gpu", ["²", "٣", "1" * 5000])
def test_gpu_in_foreign_digits_or_too_long_is_invalid_argument_on_both_sockets(
    main: grpc.Channel, admin: grpc.Channel, gpu: str
) -> None:
    calls = [
        (ppb_grpc.PartitionsStub(main).ListPartitions, ppb.ListPartitionsRequest(gpu=gpu)),  # type: ignore[no-untyped-call]
        (ppb_grpc.PartitionsStub(main).GetCapacity, ppb.GetCapacityRequest(gpu=gpu)),  # type: ignore[no-untyped-call]
        (ppb_grpc.PartitionsStub(admin).SetCardMode, ppb.SetCardModeRequest(gpu=gpu, mode=ppb.PARTITION_MODE_TDM)),  # type: ignore[no-untyped-call]
        (
            ppb_grpc.PartitionsStub(admin).CreatePartition,  # type: ignore[no-untyped-call]
            ppb.CreatePartitionRequest(gpu=gpu, owner=ppb.Owner(lease=ppb.LeaseOwner(holder="t"))),
        ),
        (tpb_grpc.TopologyStub(main).PreferredAllocation, tpb.PreferredAllocationRequest(count=1, available=[gpu])),  # type: ignore[no-untyped-call]
    ]  # fmt: skip
    for call, request in calls:
        code, message, details = failure(call, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert "expected a GPU index" in message or "at most 64 characters" in message
        assert len(message) < 250
        violation = details["BadRequest"].field_violations[0]
        assert violation.field in ("gpu", "available")
        assert details["ErrorInfo"].reason == "INVALID_FIELD"


def test_arabic_three_is_not_gpu_three(main: grpc.Channel) -> None:
    stub = ppb_grpc.PartitionsStub(main)  # type: ignore[no-untyped-call]
    assert stub.GetCapacity(ppb.GetCapacityRequest(gpu="3"), timeout=30).cards[0].gpu == 3
    code, _, _ = failure(stub.GetCapacity, ppb.GetCapacityRequest(gpu="٣"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_huge_inputs_get_short_errors_not_resource_exhausted(main: grpc.Channel, admin: grpc.Channel) -> None:
    huge = "f" * 20000
    read, write = ppb_grpc.PartitionsStub(main), ppb_grpc.PartitionsStub(admin)  # type: ignore[no-untyped-call]
    lease = ppb.Owner(lease=ppb.LeaseOwner(holder="t"))
    cases = [
        (read.GetPartition, ppb.GetPartitionRequest(id=huge), grpc.StatusCode.INVALID_ARGUMENT, "id"),
        (write.DeletePartition, ppb.DeletePartitionRequest(id=huge), grpc.StatusCode.INVALID_ARGUMENT, "id"),
        (write.CreatePartition, ppb.CreatePartitionRequest(gpu="3", owner=lease, memory=huge), None, "memory"),
        (
            write.CreatePartition,
            ppb.CreatePartitionRequest(gpu="3", owner=ppb.Owner(container=ppb.ContainerOwner(id=huge))),
            None,
            "owner.container.id",
        ),
        (write.CreatePartition, ppb.CreatePartitionRequest(gpu="3", owner=lease, request_id=huge), None, "request_id"),
        (
            write.CreatePartition,
            ppb.CreatePartitionRequest(gpu="3", owner=ppb.Owner(lease=ppb.LeaseOwner(holder=huge))),
            None,
            "owner.lease.holder",
        ),
    ]
    for call, request, _, field in cases:
        code, message, details = failure(call, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert len(message) < 300
        assert details["BadRequest"].field_violations[0].field == field
    inject = spb_grpc.SimulationStub(admin).InjectFault  # type: ignore[no-untyped-call]
    for params in ({"code": huge}, {"code": "٣"}, {"code": "1" * 5000}, {huge: "1"}):
        code, message, _ = failure(inject, spb.InjectFaultRequest(kind="xid", gpu=0, params=params))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert len(message) < 300
    code, message, _ = failure(inject, spb.InjectFaultRequest(kind=huge))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(message) < 300


def test_not_found_names_the_resource(main: grpc.Channel, admin: grpc.Channel) -> None:
    read = ppb_grpc.PartitionsStub(main)  # type: ignore[no-untyped-call]
    code, message, details = failure(read.GetPartition, ppb.GetPartitionRequest(id="p-0123456789ab"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert (details["ResourceInfo"].resource_type, details["ResourceInfo"].resource_name) == (
        "partition",
        "p-0123456789ab",
    )
    code, message, details = failure(read.GetCapacity, ppb.GetCapacityRequest(gpu="42"))
    assert code == grpc.StatusCode.NOT_FOUND and "no GPU 42" in message
    assert (details["ResourceInfo"].resource_type, details["ResourceInfo"].resource_name) == ("gpu", "42")
    inject = spb_grpc.SimulationStub(admin).InjectFault  # type: ignore[no-untyped-call]
    code, message, details = failure(inject, spb.InjectFaultRequest(kind="xid", gpu=42, params={"code": "79"}))
    assert code == grpc.StatusCode.NOT_FOUND and "gpu 42 does not exist" in message
    assert details["ResourceInfo"].resource_type == "gpu"


def test_failed_precondition_and_permission_carry_a_reason(main: grpc.Channel, admin: grpc.Channel) -> None:
    write = ppb_grpc.PartitionsStub(admin)  # type: ignore[no-untyped-call]
    code, _, details = failure(write.SetCardMode, ppb.SetCardModeRequest(gpu="0", mode=ppb.PARTITION_MODE_MIG))
    assert code == grpc.StatusCode.FAILED_PRECONDITION  # card 0 of the simulated node has no MIG
    assert details["ErrorInfo"].reason == "PARTITION_PRECONDITION"
    read = ppb_grpc.PartitionsStub(main)  # type: ignore[no-untyped-call]
    code, _, details = failure(read.SetCardMode, ppb.SetCardModeRequest(gpu="0", mode=ppb.PARTITION_MODE_TDM))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details["ErrorInfo"].reason == "READ_ONLY_SOCKET"
    # the simulated node is changed on the admin socket only: an injected XID 79 raises a real replace_node fault
    sim = spb_grpc.SimulationStub(main)  # type: ignore[no-untyped-call]
    for call, request in (
        (sim.InjectFault, spb.InjectFaultRequest(kind="xid", gpu=2, params={"code": "79"})),
        (sim.ClearFaults, spb.ClearFaultsRequest()),
    ):
        code, message, details = failure(call, request)
        assert code == grpc.StatusCode.PERMISSION_DENIED, message
        assert details["ErrorInfo"].reason == "READ_ONLY_SOCKET" and "admin socket" in message
    assert sim.ListFaultKinds(spb.ListFaultKindsRequest(), timeout=10).kinds  # a read: served here


METHODS = [
    "/xpu.runtime.v1.Partitions/ListPartitions",
    "/xpu.runtime.v1.Partitions/GetCapacity",
    "/xpu.runtime.v1.Health/ListFaults",
    "/xpu.runtime.v1.Health/GetNodeHealth",
    "/xpu.runtime.v1.Topology/PreferredAllocation",
    "/xpu.runtime.v1.Simulation/InjectFault",
    "/grpc.health.v1.Health/Check",
]


@pytest.mark.parametrize("method", METHODS)
def test_corrupt_protobuf_bytes_are_invalid_argument(main: grpc.Channel, method: str) -> None:
    code, message, details = failure(main.unary_unary(method), b"\xff\xff\xff")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message == f"the request is not a valid protobuf message for {method}"
    assert details["ErrorInfo"].reason == "MALFORMED_REQUEST"
    assert details["ErrorInfo"].metadata["method"] == method


def test_corrupt_bytes_in_a_stream_are_invalid_argument(main: grpc.Channel) -> None:
    method = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
    with pytest.raises(grpc.RpcError) as err:
        list(main.stream_stream(method)(iter([b"\xff\xff\xff"]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_xpuctl_prints_one_clear_line(daemon: DaemonProcess) -> None:
    for argv, flag in [
        (["partitions", "list", "--gpu", "²"], "--gpu"),
        (["partitions", "capacity", "--gpu", "٣"], "--gpu"),
        (["partitions", "get", "x" * 20000], "id"),
        (["partitions", "create", "--gpu", "3", "--memory", "٣GiB"], "--memory"),
        (["partitions", "create", "--gpu", "3", "--compute", "99999999999"], "--compute"),
        (["partitions", "create", "--gpu", "3", "--owner-pid", "-5"], "--owner-pid"),
        (["simulate", "inject", "xid", "--gpu", "٣", "code=79"], "--gpu"),
        (["faults", "list", "--limit", "1" * 5000], "--limit"),
        (["topology", "--preferred", "2", "--available", "0,²"], "--available"),
        (["--timeout", "nan", "health"], "--timeout"),
    ]:
        out = daemon.xpuctl(*argv)
        assert out.returncode == 2, (argv, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and flag in lines[0], (argv, out.stderr)
        assert len(lines[0]) < 300
        assert "Traceback" not in out.stderr and "invalid literal" not in out.stderr
    # the daemon's own answer, when only it can know: one line too
    out = daemon.xpuctl("partitions", "get", "p-0123456789ab")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["xpuctl: NOT_FOUND: no partition 'p-0123456789ab'"]


# ----- in-process servers: UNAVAILABLE details, and the guard's last resort --------------------------------------


class LoopServer:
    def __init__(self, socket: Path, services: list[Service]) -> None:
        self.address = f"unix:{socket}"
        self.server = GrpcServer([self.address], services)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> LoopServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.1), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_unavailable_carries_a_reason(tmp_path: Path) -> None:
    status = RefreshStatus(1, 1, 0, "GPU inventory not known yet", None)
    service = TopologyService(lambda: None, lambda: status)
    services = [Service("xpu.runtime.v1.Topology", service, _add_topology)]
    with LoopServer(tmp_path / "t.sock", services) as server, grpc.insecure_channel(server.address) as channel:
        stub = tpb_grpc.TopologyStub(channel)  # type: ignore[no-untyped-call]
        code, message, details = failure(stub.Get, tpb.GetTopologyRequest())
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "GPU inventory not known yet" in message
    assert details["ErrorInfo"].reason == "TOPOLOGY_NOT_COLLECTED"


class BrokenSimulation(SimulationService):
    async def ListFaultKinds(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise RuntimeError("secret internals: /etc/shadow")


def test_an_unexpected_exception_is_internal_without_python_text(tmp_path: Path, sim: Any) -> None:
    from healthd.sim.component import add_simulation

    service = Service("xpu.runtime.v1.Simulation", BrokenSimulation(sim.injector), add_simulation)
    with (
        structlog.testing.capture_logs() as logs,
        LoopServer(tmp_path / "s.sock", [service]) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = spb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]
        code, message, details = failure(stub.ListFaultKinds, spb.ListFaultKindsRequest())
        assert stub.ClearFaults(spb.ClearFaultsRequest(), timeout=30).description  # the server carries on
    assert code == grpc.StatusCode.INTERNAL
    assert message == "internal error in /xpu.runtime.v1.Simulation/ListFaultKinds; the daemon logged the details"
    assert "RuntimeError" not in message and "shadow" not in message
    assert details["ErrorInfo"].reason == "INTERNAL"
    assert any(e["event"] == "rpc handler failed" and e.get("exc_info") for e in logs)


def test_xpuctl_module_help_still_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "partitions", "list", "--help"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0 and "--gpu" in out.stdout
