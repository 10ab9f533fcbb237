"""gRPC Simulation service: inject faults into a running daemon whose backend offers fault injection.

The service holds the backend's FaultInjector capability (``Backend.injector``), or None on real GPUs, where every
call answers FAILED_PRECONDITION. Every parameter is checked here before the injector sees it: known names only,
numbers in ASCII digits within a range the simulated node can hold (an XID of 10**100 or a pid of "٣" never reaches
the fault journal), names as Kubernetes would accept them, and a length cap on everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import grpc

from exporter.backends.protocol import FaultInjector, UnknownGpuError
from exporter.backends.simulated.fault_docs import FAULT_DOCS
from healthd.api.v1 import simulation_pb2 as pb
from healthd.api.v1 import simulation_pb2_grpc as pb_grpc
from healthd.rpc.errors import failed_precondition, failure, from_invalid_field, invalid_argument, not_found
from healthd.rpc.validation import InvalidField, check_ascii_token, parse_ascii_uint, quote

MAX_PARAMS = 16
MAX_KIND_CHARS = 32
MAX_TEXT_CHARS = 64
COUNTER_MAX = 2**31 - 1
# parameter -> (minimum, maximum) for integers; the backend applies its own rules on top (link exists, ...)
INT_PARAMS: Mapping[str, tuple[int, int]] = {
    "code": (1, 65535),
    "corrected": (0, COUNTER_MAX),
    "uncorrected": (0, COUNTER_MAX),
    "link": (0, 255),
    "crc": (0, COUNTER_MAX),
    "replay": (0, COUNTER_MAX),
    "recovery": (0, COUNTER_MAX),
    "count": (0, COUNTER_MAX),
    "pid": (1, 4194304),
    "memory_mib": (0, 2**24),  # 16 TiB
    "gpu_instance_id": (0, 65535),
}
RATIO_PARAMS = frozenset({"load"})
DNS_LABEL_PARAMS = frozenset({"pod", "namespace", "container"})
_RATIO = re.compile(r"[0-9]{1,3}(\.[0-9]{1,9})?|\.[0-9]{1,9}", re.ASCII)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


def check_params(accepted: frozenset[str], kind: str, params: Mapping[str, str]) -> dict[str, str]:
    """The parameters of ``kind`` (which accepts the names in ``accepted``) with every value checked; numbers come
    back in canonical ASCII form."""
    if len(params) > MAX_PARAMS:
        raise InvalidField("params", f"at most {MAX_PARAMS} parameters, got {len(params)}")
    out: dict[str, str] = {}
    for key, value in sorted(params.items()):
        if key not in accepted:
            names = ", ".join(sorted(accepted)) or "none"
            raise InvalidField("params", f"fault {kind!r} does not take {quote(key, 32)} (accepted: {names})")
        field = f"params.{key}"
        if key in INT_PARAMS:
            low, high = INT_PARAMS[key]
            number = parse_ascii_uint(value, field, maximum=high)
            if number < low:
                raise InvalidField(field, f"must be at least {low}, got {number}")
            out[key] = str(number)
        elif key in RATIO_PARAMS:
            if not _RATIO.fullmatch(value.strip()) or float(value) > 1.0:
                raise InvalidField(field, f"expected a number from 0 to 1 (e.g. 0.5), got {quote(value, 32)}")
            out[key] = value.strip()
        elif key in DNS_LABEL_PARAMS:
            if not _DNS_LABEL.fullmatch(value):
                raise InvalidField(field, f"expected a lowercase DNS label (a-z, 0-9, '-'), got {quote(value, 70)}")
            out[key] = value
        else:
            out[key] = check_ascii_token(value, field, max_chars=MAX_TEXT_CHARS)
    return out


def fault_kind_pb(kind: str, params: frozenset[str]) -> pb.FaultKind:
    """A kind with what it does and each parameter's meaning, allowed values and default (a kind this build has no
    text for still lists its parameter names)."""
    doc = FAULT_DOCS.get(kind)
    parameters = []
    for name in sorted(params):
        p = doc.params.get(name) if doc else None
        if p is None:
            parameters.append(pb.FaultParameter(name=name))
            continue
        parameters.append(
            pb.FaultParameter(
                name=name,
                meaning=p.meaning,
                allowed=p.allowed,
                default_value=p.default or "",
                required=p.default is None,
            )
        )
    return pb.FaultKind(kind=kind, params=sorted(params), summary=doc.summary if doc else "", parameters=parameters)


class SimulationService(pb_grpc.SimulationServicer):
    """One instance per socket: ``writable`` (InjectFault, ClearFaults) only on the admin socket.

    An injected XID 79 or lost card raises a real fault, a replace_node hook call included, so changing the
    simulated node is for whoever may change partitions, not for every reader of the monitoring socket or the
    mTLS listener. Listing the fault kinds is a read, served everywhere."""

    def __init__(self, injector: FaultInjector | None, *, writable: bool = True) -> None:
        self._injector = injector
        self._writable = writable

    def _require_write(self, what: str) -> None:
        if not self._writable:
            raise failure(
                grpc.StatusCode.PERMISSION_DENIED,
                "READ_ONLY_SOCKET",
                f"{what} changes the simulated node: use the admin socket (this socket serves reads only)",
            )

    def _require_injector(self) -> FaultInjector:
        if self._injector is None:
            raise failed_precondition(
                "NOT_SIMULATED", "this daemon runs on real GPUs; fault injection needs --simulate"
            )
        return self._injector

    async def InjectFault(  # noqa: N802
        self,
        request: pb.InjectFaultRequest,
        context: grpc.aio.ServicerContext[pb.InjectFaultRequest, pb.InjectFaultResponse],
    ) -> pb.InjectFaultResponse:
        self._require_write("InjectFault")
        injector = self._require_injector()
        kinds = injector.kinds
        try:
            kind = check_ascii_token(request.kind, "kind", max_chars=MAX_KIND_CHARS, required=True)
            if kind not in kinds:
                raise InvalidField("kind", f"unknown fault kind {quote(kind)}; known: {', '.join(sorted(kinds))}")
            params = check_params(kinds[kind], kind, request.params)
        except InvalidField as exc:
            raise from_invalid_field(exc) from None
        try:
            description = injector.inject(kind, request.gpu, params)
        except UnknownGpuError as exc:
            raise not_found("gpu", str(request.gpu), str(exc)) from None
        except ValueError as exc:  # the injector's own rules (a link that does not exist, a pid not running, ...)
            raise invalid_argument("params", str(exc)) from None
        return pb.InjectFaultResponse(description=description)

    async def ClearFaults(  # noqa: N802
        self,
        request: pb.ClearFaultsRequest,
        context: grpc.aio.ServicerContext[pb.ClearFaultsRequest, pb.ClearFaultsResponse],
    ) -> pb.ClearFaultsResponse:
        self._require_write("ClearFaults")
        injector = self._require_injector()
        gpu = request.gpu if request.HasField("gpu") else None
        try:
            description = injector.clear(gpu)
        except UnknownGpuError as exc:
            raise not_found("gpu", str(gpu), str(exc)) from None
        return pb.ClearFaultsResponse(description=description)

    async def ListFaultKinds(  # noqa: N802
        self,
        request: pb.ListFaultKindsRequest,
        context: grpc.aio.ServicerContext[pb.ListFaultKindsRequest, pb.ListFaultKindsResponse],
    ) -> pb.ListFaultKindsResponse:
        kinds = self._require_injector().kinds
        return pb.ListFaultKindsResponse(kinds=[fault_kind_pb(k, v) for k, v in sorted(kinds.items())])
