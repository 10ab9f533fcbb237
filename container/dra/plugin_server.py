"""The DRA kubelet plugin service, v1 and v1beta1 (identical but for v1's share id), over the Preparer.

kubelet sends one call per pod with every claim of this driver not yet prepared; each claim gets its own result,
and an error is that claim's result (its ``error``), never a failed call: the other claims' results still count.
The claims of one call are prepared concurrently.

v1beta1's messages are v1's on the wire, less the device's share id (field 5): a v1beta1 call is read as v1, served,
and its answer written back as v1beta1 without share ids, as the Go kubelet plugin helper serves v1beta1 through
v1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc
import structlog

from container.dra.api.dra.v1 import api_pb2 as dra_v1
from container.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from container.dra.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from container.dra.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from container.dra.checkpoint import PreparedDevice
from container.dra.prepare import ClaimRef, PrepareError, Preparer

log = structlog.get_logger("dra.plugin")


async def _prepare_one(preparer: Preparer, claim: dra_v1.Claim) -> tuple[str, dra_v1.NodePrepareResourceResponse]:
    ref = ClaimRef(claim.namespace, claim.name, claim.uid)
    try:
        devices = await preparer.prepare(ref)
    except PrepareError as exc:
        log.warning("prepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=str(exc))
        return ref.uid, dra_v1.NodePrepareResourceResponse(error=str(exc))
    return ref.uid, dra_v1.NodePrepareResourceResponse(devices=[_device(d) for d in devices])


def _device(d: PreparedDevice) -> dra_v1.Device:
    device = dra_v1.Device(
        request_names=list(d.request_names),
        pool_name=d.pool,
        device_name=d.device,
        cdi_device_ids=list(d.cdi_device_ids),
    )
    if d.share_id:
        device.share_id = d.share_id
    return device


async def _unprepare_one(preparer: Preparer, claim: dra_v1.Claim) -> tuple[str, dra_v1.NodeUnprepareResourceResponse]:
    ref = ClaimRef(claim.namespace, claim.name, claim.uid)
    try:
        await preparer.unprepare(ref)
    except PrepareError as exc:
        log.warning("unprepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=str(exc))
        return ref.uid, dra_v1.NodeUnprepareResourceResponse(error=str(exc))
    return ref.uid, dra_v1.NodeUnprepareResourceResponse()


async def prepare_all(preparer: Preparer, claims: Iterable[dra_v1.Claim]) -> dra_v1.NodePrepareResourcesResponse:
    results = await asyncio.gather(*(_prepare_one(preparer, c) for c in claims))
    return dra_v1.NodePrepareResourcesResponse(claims=dict(results))


async def unprepare_all(preparer: Preparer, claims: Iterable[dra_v1.Claim]) -> dra_v1.NodeUnprepareResourcesResponse:
    results = await asyncio.gather(*(_unprepare_one(preparer, c) for c in claims))
    return dra_v1.NodeUnprepareResourcesResponse(claims=dict(results))


class DraV1(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(  # noqa: N802
        self,
        request: dra_v1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[dra_v1.NodePrepareResourcesRequest, dra_v1.NodePrepareResourcesResponse],
    ) -> dra_v1.NodePrepareResourcesResponse:
        return await prepare_all(self._preparer, request.claims)

    async def NodeUnprepareResources(  # noqa: N802
        self,
        request: dra_v1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[dra_v1.NodeUnprepareResourcesRequest, dra_v1.NodeUnprepareResourcesResponse],
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        return await unprepare_all(self._preparer, request.claims)


class DraV1beta1(dra_v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(  # noqa: N802
        self,
        request: dra_v1beta1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra_v1beta1.NodePrepareResourcesRequest, dra_v1beta1.NodePrepareResourcesResponse
        ],
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        as_v1 = dra_v1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        response = await prepare_all(self._preparer, as_v1.claims)
        for result in response.claims.values():
            for device in result.devices:
                device.ClearField("share_id")
        return dra_v1beta1.NodePrepareResourcesResponse.FromString(response.SerializeToString())

    async def NodeUnprepareResources(  # noqa: N802
        self,
        request: dra_v1beta1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra_v1beta1.NodeUnprepareResourcesRequest, dra_v1beta1.NodeUnprepareResourcesResponse
        ],
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        as_v1 = dra_v1.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        response = await unprepare_all(self._preparer, as_v1.claims)
        return dra_v1beta1.NodeUnprepareResourcesResponse.FromString(response.SerializeToString())
