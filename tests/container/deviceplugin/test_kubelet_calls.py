"""Malformed and hostile kubelet calls over the plugin's real gRPC server (a unix socket, a real client): every
refusal has the right status and a reason, nothing answers UNKNOWN, and no call names a device kubelet never
listed. The node view is fixed, so these calls need no daemon; the daemon paths run in tests/kubernetes/."""

from __future__ import annotations

import asyncio
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from container.core.inventory import Card, NodeView, ProfileRoom
from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.api.v1beta1 import api_pb2_grpc as kpb_grpc
from container.deviceplugin.resources import Context, Slices, WholeCards, parse_slot
from container.deviceplugin.runtime_answer import RuntimeAnswer
from container.deviceplugin.server import Changes, DevicePluginService, StreamCount, socket_name
from healthd.api.v1 import partitions_pb2 as ppb

UUIDS = [f"GPU-{i}" for i in range(4)]
SLOTS = 7
CANONICAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def _view() -> NodeView:
    profiles = {"1g.18gb": ProfileRoom("1g.18gb", 16384, 16, SLOTS, SLOTS)}
    whole = tuple(Card(i, u, 0, ppb.PARTITION_MODE_NONE, False, 143_771, 0, 0) for i, u in enumerate(UUIDS))
    mig = Card(6, "GPU-6", 1, ppb.PARTITION_MODE_MIG, True, 143_771, 0, 0, profiles=profiles)
    return NodeView(cards=(*whole, mig))


def _context(view: NodeView) -> Context:
    async def changed() -> None:
        return None

    async def read_now(within: float) -> NodeView:
        return view

    return Context(
        None,  # type: ignore[arg-type]  # no daemon: nothing here may reach it
        "xpu-runtime-kit.io",
        60,
        lambda: view,
        frozenset,
        changed,
        unmonitored=lambda: None,
        read_now=read_now,
        answer=RuntimeAnswer("cdi", Path("/nonexistent")),
    )


class _Served:
    """The plugin's DevicePlugin service for one resource on a unix socket, its loop on a thread."""

    def __init__(self, resource: Any, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.socket = directory / socket_name(resource.name)
        ready = threading.Event()

        async def serve() -> None:
            self.stopping = asyncio.Event()
            self.server = grpc.aio.server()
            service = DevicePluginService(resource, Changes(), StreamCount())
            kpb_grpc.add_DevicePluginServicer_to_server(service, self.server)
            self.server.add_insecure_port(f"unix:{self.socket}")
            await self.server.start()
            ready.set()
            await self.stopping.wait()
            await self.server.stop(0)

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.channel = grpc.insecure_channel(f"unix:{self.socket}")
        self.stub = kpb_grpc.DevicePluginStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, _Served]]:
    view = _view()
    ctx = _context(view)
    with tempfile.TemporaryDirectory(prefix="xdp-", dir="/tmp") as tmp:
        servers = {
            "gpu": _Served(WholeCards(ctx), Path(tmp)),
            "mig": _Served(Slices(ctx, profile="1g.18gb"), Path(tmp)),
        }
        yield servers
        for s in servers.values():
            s.close()


def allocate(stub: Any, ids: list[str]) -> Any:
    request = kpb.AllocateRequest(container_requests=[kpb.ContainerAllocateRequest(devices_ids=ids)])
    return stub.Allocate(request, timeout=10)


def preferred(stub: Any, available: list[str], must: list[str], size: int) -> Any:
    request = kpb.PreferredAllocationRequest(
        container_requests=[
            kpb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    return stub.GetPreferredAllocation(request, timeout=10)


def test_socket_names_carry_the_resource_name_once() -> None:
    assert socket_name("xpu-runtime-kit.io/gpu") == "xpu-runtime-kit.io_gpu.sock"
    assert socket_name("example.com/mig-1g.18gb") == "example.com_mig-1g.18gb.sock"


SUFFIXES = st.one_of(
    st.text(st.sampled_from("0123456789\u0663\u00b2\u0660\u06f1x-+ "), max_size=8),
    st.integers(0, 10**6).map(lambda n: f"0{n}"),
    st.integers(SLOTS, 10**4000).map(str),
    st.text(max_size=12),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=SUFFIXES, sep=st.sampled_from(["::", ":", "::::"]))
def test_slot_ids_kubelet_never_listed_are_not_found(served: dict[str, _Served], suffix: str, sep: str) -> None:
    device_id = f"GPU-6{sep}{suffix}"
    listed = sep == "::" and CANONICAL.fullmatch(suffix) is not None and int(suffix) < SLOTS
    assume(not listed)  # a listed slot would make a partition: that path needs the daemon (tests/kubernetes/)
    with pytest.raises(grpc.RpcError) as err:
        allocate(served["mig"].stub, [device_id])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, device_id[:80]
    assert "mig-1g.18gb" in err.value.details()


def test_parse_slot_takes_only_what_the_plugin_writes() -> None:
    assert parse_slot("GPU-6::0") == ("GPU-6", 0)
    assert parse_slot("GPU-6::12") == ("GPU-6", 12)
    for bad in ("GPU-6::01", "GPU-6::\u0663", "GPU-6::\u00b2", "GPU-6::", "::1", "GPU-6:1", "GPU-6::1x", "GPU-6:: 1"):
        assert parse_slot(bad) is None, bad


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.sampled_from([*UUIDS, "GPU-6", "GPU-nope"]), min_size=0, max_size=6))
def test_whole_card_allocate_refuses_duplicates_and_unknown_cards(served: dict[str, _Served], ids: list[str]) -> None:
    stub = served["gpu"].stub
    if not ids or len(set(ids)) < len(ids) or not set(ids) <= set(UUIDS):
        with pytest.raises(grpc.RpcError) as err:
            allocate(stub, ids)
        expected = grpc.StatusCode.NOT_FOUND if ids and len(set(ids)) == len(ids) else grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.code() == expected, ids
        return
    reply = allocate(stub, ids).container_responses[0]
    assert reply.envs["CUDA_VISIBLE_DEVICES"] == ",".join(ids)
    assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == "void"  # never the UUIDs: a legacy runtime would add them again
    assert [c.name for c in reply.cdi_devices] == [f"xpu-runtime-kit.io/gpu={i}" for i in ids]


SLOT_IDS = [f"GPU-6::{n}" for n in range(SLOTS)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    available=st.lists(st.sampled_from([*SLOT_IDS, "GPU-6::99", "junk"]), max_size=10),
    must=st.lists(st.sampled_from(SLOT_IDS), max_size=2, unique=True),
    size=st.integers(-(2**31), 2**31 - 1),
)
def test_preferred_allocation_is_a_sane_answer_or_a_clear_refusal(
    served: dict[str, _Served], available: list[str], must: list[str], size: int
) -> None:
    if size < 0:
        for stub in (served["mig"].stub, served["gpu"].stub):
            with pytest.raises(grpc.RpcError) as err:
                preferred(stub, available, must, size)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "negative" in err.value.details()
        return
    ids = list(preferred(served["mig"].stub, [*must, *available], must, size).container_responses[0].deviceIDs)
    assert len(ids) == len(set(ids)) <= size
    assert ids[: len(must)] == must[:size]  # must_include first
    assert set(ids) <= set(must) | (set(available) & set(SLOT_IDS))


class _Stuck:
    """A resource whose Allocate never returns (a daemon call that hangs)."""

    name = "xpu-runtime-kit.io/tdm-25c.32gib"
    pre_start_required = True

    def devices(self) -> list[Any]:
        return []

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        return []

    async def allocate(self, ids: list[str]) -> Any:
        await asyncio.Event().wait()

    async def pre_start(self, ids: list[str]) -> None:
        return None


def test_allocate_has_its_own_deadline_and_says_why() -> None:
    async def go() -> grpc.aio.AioRpcError:
        with tempfile.TemporaryDirectory(prefix="xdp-", dir="/tmp") as tmp:
            server = grpc.aio.server()
            service = DevicePluginService(_Stuck(), Changes(), StreamCount(), allocate_deadline=0.3)
            kpb_grpc.add_DevicePluginServicer_to_server(service, server)
            address = f"unix:{tmp}/p.sock"
            server.add_insecure_port(address)
            await server.start()
            try:
                async with grpc.aio.insecure_channel(address) as channel:
                    request = kpb.AllocateRequest(container_requests=[kpb.ContainerAllocateRequest(devices_ids=["x"])])
                    try:
                        await kpb_grpc.DevicePluginStub(channel).Allocate(request)  # no deadline, as kubelet
                    except grpc.aio.AioRpcError as exc:
                        return exc
                    raise AssertionError("Allocate answered")
            finally:
                await server.stop(0)

    error = asyncio.run(asyncio.wait_for(go(), 60))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "gave up after 0.3 s waiting for xpu-healthd" in (error.details() or "")
