"""gRPC xpu.runtime.v1.Health: node health, fault listing with filters, and the resumable fault stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from healthd.faults.convert import check_pb, fault_pb, record_pb
from healthd.faults.engine import FaultEngine
from healthd.faults.fault import FaultFilter, FaultState
from healthd.faults.model import Action, Severity
from healthd.faults.notify import CommitSignal

SERVICE_NAME = "xpu.runtime.v1.Health"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10000
MAX_FILTER_CHARS = 256
REPLAY_BATCH = 500
MAX_SEQ = 2**63 - 1
MAX_REASON_CHARS = 512


class FilterError(ValueError):
    pass


def parse_filter(request: Any) -> FaultFilter:
    """ListFaultsRequest -> FaultFilter; FilterError (-> INVALID_ARGUMENT) names the bad field."""
    if len(request.gpu) > MAX_FILTER_CHARS:
        raise FilterError(f"gpu: at most {MAX_FILTER_CHARS} characters")
    if len(request.check) > MAX_FILTER_CHARS:
        raise FilterError(f"check: at most {MAX_FILTER_CHARS} characters")
    state: FaultState | None
    if request.state == 0:
        state = None
    elif request.state == 1:
        state = FaultState.ACTIVE
    elif request.state == 2:
        state = FaultState.RESOLVED
    else:
        raise FilterError(f"state: unknown value {request.state}")
    min_severity = None
    if request.min_severity != 0:
        if not 1 <= request.min_severity <= len(Severity):
            raise FilterError(f"min_severity: unknown value {request.min_severity}")
        min_severity = Severity(request.min_severity - 1)
    min_action = None
    if request.min_action != 0:
        if not 1 <= request.min_action <= len(Action):
            raise FilterError(f"min_action: unknown value {request.min_action}")
        min_action = Action(request.min_action - 1)
    if request.limit > MAX_LIMIT:
        raise FilterError(f"limit: at most {MAX_LIMIT}, got {request.limit}")
    return FaultFilter(
        gpu=request.gpu,
        check=request.check,
        state=state,
        min_severity=min_severity,
        min_action=min_action,
        since_seq=min(request.since_seq, MAX_SEQ),  # beyond any sequence number SQLite can hold: nothing newer
        limit=request.limit or DEFAULT_LIMIT,
    )


class HealthService(pb_grpc.HealthServicer):
    """One instance per socket: ``writable`` (ResolveFault) only on the admin socket, as for partition changes."""

    def __init__(self, engine: FaultEngine, signal: CommitSignal, *, writable: bool = False) -> None:
        self._engine = engine
        self._journal = engine.journal
        self._signal = signal
        self._writable = writable

    async def GetNodeHealth(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
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

    async def ListFaults(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            flt = parse_filter(request)
        except FilterError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        last_seq = self._journal.last_seq
        faults = await asyncio.to_thread(self._journal.list_faults, flt)
        return pb.ListFaultsResponse(faults=[fault_pb(f) for f in faults], last_seq=last_seq)

    async def WatchFaults(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        last = request.after_seq
        if last > self._journal.last_seq:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"after_seq {last} is beyond the journal (last seq {self._journal.last_seq}); was the state reset?",
            )
        while True:
            records = await asyncio.to_thread(self._journal.records_after, last, REPLAY_BATCH)
            if not records:
                first = await asyncio.to_thread(self._journal.first_retained_seq)
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

    async def ResolveFault(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not self._writable:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "ResolveFault changes the fault journal: use the admin socket (this socket serves reads only)",
            )
        reason = request.reason.strip()
        if not request.id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "id: required (a fault id from ListFaults)")
        if not reason:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: required (what was repaired)")
        if len(reason) > MAX_REASON_CHARS or not reason.isprintable():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"reason: at most {MAX_REASON_CHARS} printable characters"
            )
        record = await asyncio.to_thread(self._engine.resolve_by_operator, request.id, reason)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no active fault with id {request.id[:64]!r}")
        assert record is not None
        return pb.ResolveFaultResponse(record=record_pb(record))


def add_to_server(servicer: object, server: object) -> None:
    pb_grpc.add_HealthServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
