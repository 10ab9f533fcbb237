"""The Simulation gRPC service over the FaultInjector capability, on a real gRPC server on a unix socket.

The service must serve whatever injector the backend offers (its kinds, its rules) and refuse every call when the
backend offers none (real GPUs), without knowing which backend is behind it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.backends.protocol import FaultInjector, UnknownGpuError
from healthd.api.v1 import simulation_pb2 as spb
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc
from healthd.rpc.server import Service
from healthd.sim.component import add_simulation
from healthd.sim.service import SimulationService
from tests.healthd.rpc.test_grpc_errors import LoopServer, failure


class RecordingInjector:
    """A FaultInjector that is not the simulated backend's: two cards, one kind, and a rule of its own."""

    def __init__(self) -> None:
        self.injected: list[tuple[str, int, dict[str, str]]] = []
        self.cleared: list[int | None] = []

    @property
    def kinds(self) -> Mapping[str, frozenset[str]]:
        return {"blink": frozenset({"code", "link"})}

    def inject(self, kind: str, gpu: int = 0, params: Mapping[str, str] | None = None) -> str:
        if not 0 <= gpu < 2:
            raise UnknownGpuError(gpu, 2)
        if params and params.get("link") == "9":
            raise ValueError("link 9 is dark on this node")
        self.injected.append((kind, gpu, dict(params or {})))
        return f"{kind} on GPU {gpu}"

    def clear(self, gpu: int | None = None) -> str:
        if gpu is not None and not 0 <= gpu < 2:
            raise UnknownGpuError(gpu, 2)
        self.cleared.append(gpu)
        return "cleared"


@contextmanager
def _stub(tmp_path: Path, injector: FaultInjector | None) -> Iterator[Any]:
    service = Service("xpu.runtime.v1.Simulation", SimulationService(injector), add_simulation)
    with LoopServer(tmp_path / "sim.sock", [service]) as server, grpc.insecure_channel(server.address) as channel:
        yield spb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture
def recording() -> RecordingInjector:
    return RecordingInjector()


@pytest.fixture
def stub(tmp_path: Path, recording: RecordingInjector) -> Iterator[Any]:
    with _stub(tmp_path, recording) as served:
        yield served


def test_real_gpus_refuse_every_call(tmp_path: Path) -> None:
    with _stub(tmp_path, None) as real:
        calls = (
            (real.InjectFault, spb.InjectFaultRequest(kind="xid", gpu=0, params={"code": "79"})),
            (real.ClearFaults, spb.ClearFaultsRequest()),
            (real.ListFaultKinds, spb.ListFaultKindsRequest()),
        )
        for call, request in calls:
            code, message, details = failure(call, request)
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details["ErrorInfo"].reason == "NOT_SIMULATED"
            assert "--simulate" in message


def test_kinds_and_parameters_come_from_the_injector(stub: Any, recording: RecordingInjector) -> None:
    kinds = stub.ListFaultKinds(spb.ListFaultKindsRequest(), timeout=30).kinds
    assert [(k.kind, list(k.params)) for k in kinds] == [("blink", ["code", "link"])]
    answer = stub.InjectFault(spb.InjectFaultRequest(kind="blink", gpu=1, params={"code": "007"}), timeout=30)
    assert answer.description == "blink on GPU 1"
    assert recording.injected == [("blink", 1, {"code": "7"})], "numbers reach the injector in canonical form"
    code, message, _ = failure(stub.InjectFault, spb.InjectFaultRequest(kind="xid", gpu=0, params={"code": "79"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "known: blink" in message
    code, message, _ = failure(stub.InjectFault, spb.InjectFaultRequest(kind="blink", gpu=0, params={"pid": "1"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "accepted: code, link" in message
    assert len(recording.injected) == 1, "refused requests never reach the injector"


def test_the_injectors_own_refusals_keep_their_status(stub: Any, recording: RecordingInjector) -> None:
    code, message, details = failure(stub.InjectFault, spb.InjectFaultRequest(kind="blink", gpu=5))
    assert code == grpc.StatusCode.NOT_FOUND and "gpu 5 does not exist (this node has 2)" in message
    assert (details["ResourceInfo"].resource_type, details["ResourceInfo"].resource_name) == ("gpu", "5")
    code, message, _ = failure(stub.InjectFault, spb.InjectFaultRequest(kind="blink", gpu=0, params={"link": "9"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "link 9 is dark" in message
    code, _, details = failure(stub.ClearFaults, spb.ClearFaultsRequest(gpu=3))
    assert code == grpc.StatusCode.NOT_FOUND and details["ResourceInfo"].resource_name == "3"
    assert stub.ClearFaults(spb.ClearFaultsRequest(gpu=1), timeout=30).description == "cleared"
    assert stub.ClearFaults(spb.ClearFaultsRequest(), timeout=30).description == "cleared"
    assert recording.cleared == [1, None]
