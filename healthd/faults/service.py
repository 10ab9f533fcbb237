"""gRPC xpu.runtime.v1.Health: node health, fault listing with filters, and the resumable fault stream."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

import grpc

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from healthd.faults.convert import check_pb, fault_pb, record_pb
from healthd.faults.engine import FaultEngine
from healthd.faults.fault import FaultFilter, FaultState
from healthd.faults.notify import CommitSignal
from healthd.findings import Action, Severity
from healthd.rpc.errors import failure, from_invalid_field, not_found
from healthd.rpc.validation import InvalidField, check_ascii_token, check_text, parse_gpu_ref, quote

T = TypeVar("T")
P = ParamSpec("P")
SERVICE_NAME = "xpu.runtime.v1.Health"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10000
MAX_CHECK_CHARS = 64
REPLAY_BATCH = 500
MAX_SEQ = 2**63 - 1
MAX_REASON_CHARS = 512
MAX_ID_CHARS = 64


def parse_filter(request: pb.ListFaultsRequest) -> FaultFilter:
    """ListFaultsRequest -> FaultFilter; InvalidField (-> INVALID_ARGUMENT) names the bad field."""
    gpu = "" if not request.gpu else str(parse_gpu_ref(request.gpu, "gpu"))  # "03" -> "3"; "٣" is refused
    check = check_ascii_token(request.check, "check", max_chars=MAX_CHECK_CHARS)
    state: FaultState | None
    if request.state == 0:
        state = None
    elif request.state == 1:
        state = FaultState.ACTIVE
    elif request.state == 2:
        state = FaultState.RESOLVED
    else:
        raise InvalidField("state", f"unknown value {request.state}")
    min_severity = None
    if request.min_severity != 0:
        if not 1 <= request.min_severity <= len(Severity):
            raise InvalidField("min_severity", f"unknown value {request.min_severity}")
        min_severity = Severity(request.min_severity - 1)
    min_action = None
    if request.min_action != 0:
        if not 1 <= request.min_action <= len(Action):
            raise InvalidField("min_action", f"unknown value {request.min_action}")
        min_action = Action(request.min_action - 1)
    if request.limit > MAX_LIMIT:
        raise InvalidField("limit", f"at most {MAX_LIMIT}, got {request.limit}")
    return FaultFilter(
        gpu=gpu,
        check=check,
        state=state,
        min_severity=min_severity,
        min_action=min_action,
        since_seq=min(request.since_seq, MAX_SEQ),  # beyond any sequence number SQLite can hold: nothing newer
        limit=request.limit or DEFAULT_LIMIT,
    )


class HealthService(pb_grpc.HealthServicer):
    """GetNodeHealth answers from memory; journal reads run on the journal's own executor, never on the loop.
    One instance per socket: ``writable`` (ResolveFault) only on the admin socket, as for partition changes."""

    def __init__(
        self, engine: FaultEngine, signal: CommitSignal, journal_io: Executor, *, writable: bool = False
    ) -> None:
        self._engine = engine
        self._journal = engine.journal
        self._signal = signal
        self._io = journal_io
        self._writable = writable

    async def _read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(fn, *args, **kwargs))

    async def GetNodeHealth(  # noqa: N802
        self,
        request: pb.GetNodeHealthRequest,
        context: grpc.aio.ServicerContext[pb.GetNodeHealthRequest, pb.GetNodeHealthResponse],
    ) -> pb.GetNodeHealthResponse:
        checks = sorted(
            self._engine.check_states(),
            key=lambda c: (c.result.check, -1 if c.result.gpu is None else c.result.gpu.index),
        )
        return pb.GetNodeHealthResponse(
            checks=[check_pb(c) for c in checks],
            active_faults=[fault_pb(f) for f in self._engine.active_faults()],
            last_seq=self._journal.last_seq,
            boot_id=self._engine.boot_id,
        )

    async def ListFaults(  # noqa: N802
        self,
        request: pb.ListFaultsRequest,
        context: grpc.aio.ServicerContext[pb.ListFaultsRequest, pb.ListFaultsResponse],
    ) -> pb.ListFaultsResponse:
        try:
            flt = parse_filter(request)
        except InvalidField as exc:
            raise from_invalid_field(exc) from None
        last_seq = self._journal.last_seq
        faults = await self._read(self._journal.list_faults, flt)
        return pb.ListFaultsResponse(faults=[fault_pb(f) for f in faults], last_seq=last_seq)

    async def WatchFaults(  # noqa: N802
        self,
        request: pb.WatchFaultsRequest,
        context: grpc.aio.ServicerContext[pb.WatchFaultsRequest, pb.WatchFaultsResponse],
    ) -> AsyncIterator[pb.WatchFaultsResponse]:
        last = request.after_seq
        if last > self._journal.last_seq:
            raise failure(
                grpc.StatusCode.OUT_OF_RANGE,
                "AFTER_SEQ_BEYOND_JOURNAL",
                f"after_seq {last} is beyond the journal (last seq {self._journal.last_seq}); was the state reset?",
                last_seq=str(self._journal.last_seq),
            )
        while True:
            records = await self._read(self._journal.records_after, last, REPLAY_BATCH)
            if not records:
                first = await self._read(self._journal.first_retained_seq)
                if first > last + 1 and self._journal.last_seq >= first - 1 > last:
                    yield pb.WatchFaultsResponse(gap=pb.Gap(from_seq=last + 1, to_seq=first - 1))
                    last = first - 1
                    continue
                await self._signal.wait_beyond(last)
                continue
            for record in records:
                if record.seq != last + 1:
                    yield pb.WatchFaultsResponse(gap=pb.Gap(from_seq=last + 1, to_seq=record.seq - 1))
                yield pb.WatchFaultsResponse(record=record_pb(record))
                last = record.seq

    async def ResolveFault(  # noqa: N802
        self,
        request: pb.ResolveFaultRequest,
        context: grpc.aio.ServicerContext[pb.ResolveFaultRequest, pb.ResolveFaultResponse],
    ) -> pb.ResolveFaultResponse:
        if not self._writable:
            raise failure(
                grpc.StatusCode.PERMISSION_DENIED,
                "READ_ONLY_SOCKET",
                "ResolveFault changes the fault journal: use the admin socket (this socket serves reads only)",
            )
        try:
            fault_id = check_text(request.id, "id", max_chars=MAX_ID_CHARS, required=True)
            reason = check_text(request.reason.strip(), "reason", max_chars=MAX_REASON_CHARS, required=True)
        except InvalidField as exc:
            raise from_invalid_field(exc) from None
        record = await self._read(self._engine.resolve_by_operator, fault_id, reason)
        if record is None:
            raise not_found("fault", fault_id, f"no active fault with id {quote(fault_id)}", field="id")
        return pb.ResolveFaultResponse(record=record_pb(record))


def add_to_server(servicer: pb_grpc.HealthServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_HealthServicer_to_server(servicer, server)
