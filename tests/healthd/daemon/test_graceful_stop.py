"""SIGTERM path of the gRPC server: a call in flight when stop() begins still completes; new calls are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from healthd.rpc.server import GrpcServer, Service

METHOD = "/xpu.test.Slow/Echo"


def test_in_flight_call_finishes_during_stop(tmp_path: Path) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started.set()
        await release.wait()
        return b"done:" + request

    handler = grpc.method_handlers_generic_handler(
        "xpu.test.Slow",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo)},
    )

    def add(servicer: object, server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((handler,))

    async def body() -> None:
        address = f"unix:{tmp_path}/h.sock"
        server = GrpcServer([address], [Service("xpu.test.Slow", None, add)])
        await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(METHOD)(b"x", timeout=30)
            await started.wait()
            stopping = asyncio.create_task(server.stop(grace=10))
            await asyncio.sleep(0.2)  # stop() has begun: the server no longer accepts new calls
            late = await _try(channel.unary_unary(METHOD)(b"late", timeout=5))
            release.set()
            assert await call == b"done:x"
            await stopping
        assert isinstance(late, grpc.aio.AioRpcError)
        assert late.code() == grpc.StatusCode.UNAVAILABLE
        assert not (tmp_path / "h.sock").exists()

    asyncio.run(body())


async def _try(call: object) -> object:
    try:
        return await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc
