"""gRPC errors with google.rpc.Status details, so a client in any language can act on them without parsing text.

Every error carries an ``ErrorInfo`` (a stable UPPER_SNAKE reason in the domain ``xpu-runtime-kit.io``, plus
metadata such as the GPU), INVALID_ARGUMENT a ``BadRequest`` with one field violation per bad field, NOT_FOUND a
``ResourceInfo`` naming what was looked up. The details travel in the ``grpc-status-details-bin`` trailer, as
grpcio-status and the other gRPC implementations read them.

Handlers raise :class:`RpcFailure`; the server's guard (healthd/rpc/guard.py) turns it into the status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from healthd.rpc.validation import QUOTE_CHARS, InvalidField

DOMAIN = "xpu-runtime-kit.io"
MAX_MESSAGE_CHARS = 1000  # a status message is response metadata: keep it far below gRPC's 8 KiB soft limit


class RpcFailure(Exception):  # noqa: N818 (the RPC failed; named for what the caller sees)
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str,
        violations: Iterable[tuple[str, str]] = (),
        resource: tuple[str, str] | None = None,  # (type, name), e.g. ("partition", "p-1a2b")
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.violations = tuple((field, _cap(text, 300)) for field, text in violations)
        self.resource = None if resource is None else (resource[0], _cap(resource[1], QUOTE_CHARS))
        self.metadata = {k: _cap(v, QUOTE_CHARS) for k, v in (metadata or {}).items()}

    def status(self) -> grpc.Status:
        details = [error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.metadata)]
        if self.violations:
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in self.violations
                    ]
                )
            )
        if self.resource is not None:
            details.append(
                error_details_pb2.ResourceInfo(
                    resource_type=self.resource[0], resource_name=self.resource[1], description=self.message
                )
            )
        packed = []
        for detail in details:
            holder = any_pb2.Any()
            holder.Pack(detail)
            packed.append(holder)
        message = status_pb2.Status(code=self.code.value[0], message=self.message, details=packed)
        status: grpc.Status = rpc_status.to_status(message)  # grpcio-status has no type hints
        return status


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def invalid_argument(field: str, description: str, *, reason: str = "INVALID_FIELD") -> RpcFailure:
    return RpcFailure(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field}: {description}" if field else description,
        reason=reason,
        violations=[(field, description)],
        metadata={"field": field} if field else None,
    )


def from_invalid_field(exc: InvalidField) -> RpcFailure:
    return invalid_argument(exc.field, exc.description)


def corrupt_request(method: str) -> RpcFailure:
    return RpcFailure(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request is not a valid protobuf message for {method}",
        reason="MALFORMED_REQUEST",
        violations=[("", "cannot be decoded as the method's request message")],
        metadata={"method": method},
    )


def not_found(resource_type: str, name: str, message: str, *, field: str = "") -> RpcFailure:
    meta = {"resource_type": resource_type, **({"field": field} if field else {})}
    return RpcFailure(
        grpc.StatusCode.NOT_FOUND, message, reason="NOT_FOUND", resource=(resource_type, name), metadata=meta
    )


def failed_precondition(reason: str, message: str, **metadata: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message, reason=reason, metadata=metadata)


def unavailable(reason: str, message: str, **metadata: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message, reason=reason, metadata=metadata)


def failure(code: grpc.StatusCode, reason: str, message: str, **metadata: str) -> RpcFailure:
    """Any other status (PERMISSION_DENIED, RESOURCE_EXHAUSTED, OUT_OF_RANGE, ...) with an ErrorInfo."""
    return RpcFailure(code, message, reason=reason, metadata=metadata)


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: RpcFailure) -> NoReturn:
    status = exc.status()
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("abort returned")  # pragma: no cover
