"""A server interceptor that makes every RPC fail cleanly, whatever the client sends.

grpcio answers a request that does not deserialize with UNKNOWN (and the exception's text), and an exception that
escapes a handler the same way. This guard wraps every method handler of the server (ours, grpc.health.v1 and
reflection alike):

- the request deserializer returns a marker instead of raising on bytes that are not the method's message, and
  the wrapped handler answers INVALID_ARGUMENT (MALFORMED_REQUEST) for it, before the servicer runs;
- :class:`RpcFailure` raised by a handler becomes its status with google.rpc details;
- any other exception is logged with its traceback and answered INTERNAL with a fixed text: Python's exception
  text never reaches a client (tests assert that INTERNAL never comes back, so such a bug still shows).

Handlers must be coroutines or async generators (every servicer of this project is); a synchronous handler is
passed through unwrapped.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias, TypeVar, cast

import grpc
import structlog
from google.protobuf.message import DecodeError

from healthd.rpc.errors import RpcFailure, abort, corrupt_request

log = structlog.get_logger("grpc")

# The guard wraps the handler of every method, whatever its messages: requests and responses pass through it as
# opaque values (it only asks whether a request decoded).
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Request = TypeVar("Request")
Response = TypeVar("Response")
_BUILDERS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class _Corrupt:
    """Stands in for a request that did not deserialize (the class itself is the marker; never instantiated)."""


def _tolerant(
    deserializer: Callable[[bytes], Request] | None,
) -> Callable[[bytes], Request | type[_Corrupt]] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Request | type[_Corrupt]:
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError):
            return _Corrupt

    return deserialize


def _internal(method: str) -> RpcFailure:
    return RpcFailure(
        grpc.StatusCode.INTERNAL,
        f"internal error in {method}; the daemon logged the details",
        reason="INTERNAL",
        metadata={"method": method},
    )


async def _fail(context: Context, method: str, exc: Exception) -> NoReturn:
    if isinstance(exc, RpcFailure):
        await abort(context, exc)
    log.exception("rpc handler failed", method=method)
    await abort(context, _internal(method))


async def _checked_stream(requests: AsyncIterable[object], context: Context, method: str) -> AsyncIterator[object]:
    async for request in requests:
        if request is _Corrupt:
            await abort(context, corrupt_request(method))
        yield request


def _wrap_unary_response(
    method: str, behavior: Callable[[object, Context], Awaitable[object]], streaming_request: bool
) -> Callable[[object, Context], Awaitable[object]]:
    async def handle(request: object, context: Context) -> object:
        if streaming_request:
            request = _checked_stream(cast("AsyncIterable[object]", request), context, method)
        elif request is _Corrupt:
            await abort(context, corrupt_request(method))
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _fail(context, method, exc)

    return handle


def _wrap_generator(
    method: str, behavior: Callable[[object, Context], AsyncIterator[object]], streaming_request: bool
) -> Callable[[object, Context], AsyncIterator[object]]:
    async def handle(request: object, context: Context) -> AsyncIterator[object]:
        if streaming_request:
            request = _checked_stream(cast("AsyncIterable[object]", request), context, method)
        elif request is _Corrupt:
            await abort(context, corrupt_request(method))
        try:
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _fail(context, method, exc)

    return handle


def guard_handler(method: str, handler: Handler) -> Handler:
    """The same RpcMethodHandler with a tolerant deserializer and a guarded behavior."""
    streaming_request = bool(handler.request_streaming)
    name, build = _BUILDERS[(streaming_request, bool(handler.response_streaming))]
    behavior = getattr(handler, name)
    wrapped: Callable[[object, Context], object]
    if inspect.isasyncgenfunction(behavior):
        wrapped = _wrap_generator(method, behavior, streaming_request)
    elif inspect.iscoroutinefunction(behavior):
        wrapped = _wrap_unary_response(method, behavior, streaming_request)
    else:
        return handler
    return build(wrapped, _tolerant(handler.request_deserializer), handler.response_serializer)


class RequestGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Request, Response] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Request, Response] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: grpc answers UNIMPLEMENTED
        return guard_handler(handler_call_details.method, handler)
