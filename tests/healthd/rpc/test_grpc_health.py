"""grpc.health.v1 on a real daemon's two sockets, spoken by a real grpc client: every method reflection advertises
answers (List included), and each socket reports only the services it hosts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

from healthd.rpc.health import HealthServicer
from tests.support.daemon_process import DaemonProcess

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
CARDS = {f"xpu.runtime.v1.gpu/{i}" for i in range(8)}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("health")) as d:
        yield d


def admin_address(d: DaemonProcess) -> str:
    return f"unix:{d.socket.parent / 'healthd-admin.sock'}"


def listed(address: str) -> dict[str, int]:
    """List, once the per-card statuses are in (the daemon mirrors its node status once a second)."""
    deadline = time.monotonic() + 20
    while True:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
        statuses = {name: r.status for name, r in reply.statuses.items()}
        if statuses.keys() >= CARDS or time.monotonic() > deadline:
            return statuses
        time.sleep(0.2)


def check(address: str, service: str) -> grpc.StatusCode | int:
    with grpc.insecure_channel(address) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                .status
            )
        except grpc.RpcError as exc:
            return exc.code()


def reflected_services(address: str) -> dict[str, descriptor_pb2.ServiceDescriptorProto]:
    """What grpcurl does for `list` and `describe`: every service reflection names, with its descriptor."""
    with grpc.insecure_channel(address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=v1alpha.ServerReflectionRequest.SerializeToString,
            response_deserializer=v1alpha.ServerReflectionResponse.FromString,
        )
        [names] = info(iter([v1alpha.ServerReflectionRequest(list_services="")]), timeout=30)
        out = {}
        for svc in names.list_services_response.service:
            [reply] = info(iter([v1alpha.ServerReflectionRequest(file_containing_symbol=svc.name)]), timeout=30)
            for raw in reply.file_descriptor_response.file_descriptor_proto:
                proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
                for s in proto.service:
                    if f"{proto.package}.{s.name}" == svc.name:
                        out[svc.name] = s
    return out


@pytest.mark.parametrize("socket", ["main", "admin"])
def test_every_health_method_reflection_advertises_answers(daemon: DaemonProcess, socket: str) -> None:
    address = daemon.address if socket == "main" else admin_address(daemon)
    services = reflected_services(address)
    methods = {m.name for m in services["grpc.health.v1.Health"].method}
    assert methods == {"Check", "Watch", "List"}
    pool = descriptor_pool.Default()
    for name in sorted(methods):
        method = pool.FindMethodByName(f"grpc.health.v1.Health.{name}")
        request = message_factory.GetMessageClass(method.input_type)()
        response_cls = message_factory.GetMessageClass(method.output_type)
        with grpc.insecure_channel(address) as channel:
            path = f"/grpc.health.v1.Health/{name}"
            if method.server_streaming:
                call = channel.unary_stream(path, request.SerializeToString, response_cls.FromString)
                stream = call(request, timeout=10)
                first = next(iter(stream))
                stream.cancel()
            else:
                first = channel.unary_unary(path, request.SerializeToString, response_cls.FromString)(
                    request, timeout=10
                )
        assert first.ByteSize() > 0, name  # an answer, not UNIMPLEMENTED (which raises)


def test_list_names_the_server_its_services_and_the_cards(daemon: DaemonProcess) -> None:
    main = listed(daemon.address)
    assert main[""] == SERVING
    assert main.keys() >= CARDS
    assert {"xpu.runtime.v1.Health", "xpu.runtime.v1.Simulation", "xpu.runtime.v1.Partitions"} <= main.keys()
    served = set(reflected_services(daemon.address)) - {
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert main.keys() - CARDS - {""} == served  # each service the socket hosts, nothing else


def test_each_socket_reports_only_what_it_serves(daemon: DaemonProcess) -> None:
    admin = listed(admin_address(daemon))
    admin_hosts = set(reflected_services(admin_address(daemon))) - {
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert "xpu.runtime.v1.Topology" not in admin_hosts  # served on the main socket only
    assert admin.keys() - CARDS - {""} == admin_hosts
    assert check(admin_address(daemon), "xpu.runtime.v1.Topology") == grpc.StatusCode.NOT_FOUND
    assert check(daemon.address, "xpu.runtime.v1.Topology") in (SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check(admin_address(daemon), "xpu.runtime.v1.gpu/0") == SERVING


def test_list_follows_the_library_servicer_rules_on_shutdown() -> None:
    """A stopping daemon lists everything NOT_SERVING, as Check says (the library's graceful-shutdown rule)."""

    async def scenario() -> dict[str, int]:
        servicer = HealthServicer()
        await servicer.set("a", SERVING)
        await servicer.enter_graceful_shutdown()
        await servicer.set("a", SERVING)  # ignored once shutting down
        reply = await servicer.List(health_pb2.HealthListRequest(), context=None)  # type: ignore[arg-type]
        return {k: v.status for k, v in reply.statuses.items()}

    assert asyncio.run(scenario()) == dict.fromkeys(["", "a"], health_pb2.HealthCheckResponse.NOT_SERVING)
