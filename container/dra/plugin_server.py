"""The DRA kubelet plugin service, v1 and v1beta1 (identical but for v1's share id), over the Preparer.

kubelet sends one call per pod with every claim of this driver not yet prepared; each claim gets its own result,
and an error is that claim's result (its ``error``), never a failed call: the other claims' results still count.
The claims of one call are prepared concurrently."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import structlog

from container.dra.api.dra.v1 import api_pb2 as dra_v1
from container.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from container.dra.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from container.dra.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from container.dra.checkpoint import PreparedDevice
from container.dra.prepare import ClaimRef, PrepareError, Preparer

log = structlog.get_logger("dra.plugin")


async def _prepare_one(preparer: Preparer, pb: Any, claim: Any, with_share: bool) -> tuple[str, Any]:
    ref = ClaimRef(claim.namespace, claim.name, claim.uid)
    try:
        devices = await preparer.prepare(ref)
    except PrepareError as exc:
        log.warning("prepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=str(exc))
        return ref.uid, pb.NodePrepareResourceResponse(error=str(exc))
    return ref.uid, pb.NodePrepareResourceResponse(devices=[_device(pb, d, with_share) for d in devices])


def _device(pb: Any, d: PreparedDevice, with_share: bool) -> Any:
    device = pb.Device(
        request_names=list(d.request_names),
        pool_name=d.pool,
        device_name=d.device,
        cdi_device_ids=list(d.cdi_device_ids),
    )
    if with_share and d.share_id:
        device.share_id = d.share_id
    return device


async def _unprepare_one(preparer: Preparer, pb: Any, claim: Any) -> tuple[str, Any]:
    ref = ClaimRef(claim.namespace, claim.name, claim.uid)
    try:
        await preparer.unprepare(ref)
    except PrepareError as exc:
        log.warning("unprepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=str(exc))
        return ref.uid, pb.NodeUnprepareResourceResponse(error=str(exc))
    return ref.uid, pb.NodeUnprepareResourceResponse()


async def prepare_all(preparer: Preparer, pb: Any, claims: Any, *, with_share: bool) -> Any:
    results = await asyncio.gather(*(_prepare_one(preparer, pb, c, with_share) for c in claims))
    return pb.NodePrepareResourcesResponse(claims=dict(results))


async def unprepare_all(preparer: Preparer, pb: Any, claims: Any) -> Any:
    results = await asyncio.gather(*(_unprepare_one(preparer, pb, c) for c in claims))
    return pb.NodeUnprepareResourcesResponse(claims=dict(results))


class DraV1(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(  # noqa: N802
        self,
        request: dra_v1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[dra_v1.NodePrepareResourcesRequest, dra_v1.NodePrepareResourcesResponse],
    ) -> dra_v1.NodePrepareResourcesResponse:
        response: dra_v1.NodePrepareResourcesResponse = await prepare_all(
            self._preparer, dra_v1, request.claims, with_share=True
        )
        return response

    async def NodeUnprepareResources(  # noqa: N802
        self,
        request: dra_v1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[dra_v1.NodeUnprepareResourcesRequest, dra_v1.NodeUnprepareResourcesResponse],
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        response: dra_v1.NodeUnprepareResourcesResponse = await unprepare_all(self._preparer, dra_v1, request.claims)
        return response


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
        response: dra_v1beta1.NodePrepareResourcesResponse = await prepare_all(
            self._preparer, dra_v1beta1, request.claims, with_share=False
        )
        return response

    async def NodeUnprepareResources(  # noqa: N802
        self,
        request: dra_v1beta1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra_v1beta1.NodeUnprepareResourcesRequest, dra_v1beta1.NodeUnprepareResourcesResponse
        ],
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        response: dra_v1beta1.NodeUnprepareResourcesResponse = await unprepare_all(
            self._preparer, dra_v1beta1, request.claims
        )
        return response
