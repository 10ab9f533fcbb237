"""Server reflection in both protocol versions: ``grpc.reflection.v1`` (what current grpcurl, grpc_cli and Postman
successors ask for first) and ``grpc.reflection.v1alpha`` (older clients).

grpcio-reflection ships only the v1alpha servicer (grpc/grpc#38576). The v1 protocol is the same schema under a new
package name, field for field, so one servicer answers both: its v1alpha messages are byte-for-byte valid v1
messages. The v1 service's own descriptor is derived from the installed v1alpha file (package renamed) and added to
the default descriptor pool, so that a client can also describe ``grpc.reflection.v1.ServerReflection``.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_grpc

V1ALPHA_SERVICE: str = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"  # the name the upstream grpc-proto file has


def v1_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The v1 reflection file: the v1alpha one with its package (and every type reference) renamed."""
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    new = f".{V1_PACKAGE}."
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    proto.ClearField("options")  # java/objc package names of v1alpha do not apply

    def rename(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
        for nested in message.nested_type:
            rename(nested)

    for message in proto.message_type:
        rename(message)
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    return proto


def register_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add the v1 file to ``pool`` unless it already knows the v1 service (idempotent)."""
    try:
        pool.FindServiceByName(V1_SERVICE)
    except KeyError:
        pool.AddSerializedFile(v1_file_descriptor().SerializeToString())


def enable_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve both reflection versions on ``server``; both list ``service_names`` and themselves."""
    register_v1_descriptor(descriptor_pool.Default())
    servicer = reflection.aio.ReflectionServicer([*service_names, V1ALPHA_SERVICE, V1_SERVICE])
    v1alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1_info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": v1_info}),)
    )
