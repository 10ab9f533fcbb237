"""The pod-resources client against a real gRPC server speaking kubelet's v1 protocol on a unix socket."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from exporter.attribution.api.podresources.v1 import api_pb2 as pb
from exporter.attribution.api.podresources.v1 import api_pb2_grpc
from exporter.attribution.kubelet import DeviceAllocation, KubeletPodResources, split_device_id
from healthd.sim.node import SimulatedKubelet

GPU0 = "GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f50"
GPU1 = "GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f51"
MIG = "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes; pytest's tmp_path can be long
    short = Path("/tmp") / f"xpu-kl-{abs(hash(tmp_path)) % 10**8}"
    short.mkdir(exist_ok=True)
    yield short / "kubelet.sock"
    for p in short.iterdir():
        p.unlink()
    short.rmdir()


class _Box:
    def __init__(self, items: list[DeviceAllocation]) -> None:
        self.items = items
        self.lock = threading.Lock()

    def get(self) -> list[DeviceAllocation]:
        with self.lock:
            return list(self.items)


@pytest.fixture
def kubelet_server(sock: Path) -> Iterator[tuple[SimulatedKubelet, _Box]]:
    box = _Box(
        [
            DeviceAllocation("ml", "train-0", "trainer", "nvidia.com/gpu", GPU0),
            DeviceAllocation("inf", "a", "srv", "nvidia.com/gpu", f"{GPU1}::0"),
            DeviceAllocation("inf", "b", "srv", "nvidia.com/gpu", f"{GPU1}::1"),
            DeviceAllocation("nb", "j", "kernel", "nvidia.com/mig-3g.71gb", MIG),
        ]
    )
    server = SimulatedKubelet(sock, box.get, lambda: [("nvidia.com/gpu", GPU0), ("nvidia.com/gpu", GPU1)])
    server.start()
    yield server, box
    server.stop()


def test_list_and_allocatable_over_the_real_protocol(sock: Path, kubelet_server: Any) -> None:
    client = KubeletPodResources(sock, refresh_interval=60)
    try:
        view = client.refresh()
    finally:
        client.stop()
    assert view.state == "ok"
    assert set(view.allocations) == set(kubelet_server[1].items)
    assert ("nvidia.com/gpu", GPU1) in view.allocatable
    assert view.last_success is not None


def test_raw_stub_sees_kubelets_service_name(sock: Path, kubelet_server: Any) -> None:
    """The full method name on the wire is /v1.PodResourcesLister/List, as kubelet serves it."""
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        raw = channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )
        reply = raw(pb.ListPodResourcesRequest(), timeout=5)
    names = {(p.namespace, p.name) for p in reply.pod_resources}
    assert names == {("ml", "train-0"), ("inf", "a"), ("inf", "b"), ("nb", "j")}


def test_missing_socket_is_quiet_absent_state(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        client = KubeletPodResources(tmp_path / "nope.sock", refresh_interval=60)
        for _ in range(5):
            view = client.refresh()
    assert view.state == "absent"
    assert view.allocations == ()
    assert [entry["log_level"] for entry in logs] == ["info"]  # one line, not one per refresh


def test_kubelet_restart_replaces_socket_and_client_follows(sock: Path, kubelet_server: Any) -> None:
    server, box = kubelet_server
    client = KubeletPodResources(sock, refresh_interval=60, stale_after=3600)
    try:
        assert client.refresh().state == "ok"
        # kubelet goes down: the socket disappears; the client reports absent and drops nothing it can't know
        server.stop()
        down = client.refresh()
        assert down.state == "absent"
        # kubelet comes back on a new socket file with new pods
        box.items = [DeviceAllocation("ml", "train-1", "trainer", "nvidia.com/gpu", GPU0)]
        restarted = SimulatedKubelet(sock, box.get)
        restarted.start()
        try:
            view = client.refresh()
            assert view.state == "ok"
            assert [a.pod for a in view.allocations] == ["train-1"]
        finally:
            restarted.stop()
    finally:
        client.stop()


def test_server_replaced_without_gap_is_noticed_by_inode(sock: Path, kubelet_server: Any) -> None:
    server, box = kubelet_server
    client = KubeletPodResources(sock, refresh_interval=60)
    try:
        assert client.refresh().state == "ok"
        server.stop()
        box.items = [DeviceAllocation("x", "y", "z", "nvidia.com/gpu", GPU1)]
        second = SimulatedKubelet(sock, box.get)
        second.start()  # new socket inode at the same path before the client looked again
        try:
            view = client.refresh()
            assert view.state == "ok"
            assert [a.pod for a in view.allocations] == ["y"]
        finally:
            second.stop()
    finally:
        client.stop()


class _Broken(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.fail = False

    def List(self, request: Any, context: Any) -> Any:
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is shutting down")
        return pb.ListPodResourcesResponse(
            pod_resources=[
                pb.PodResources(
                    name="p",
                    namespace="n",
                    containers=[
                        pb.ContainerResources(
                            name="c", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU0])]
                        )
                    ],
                )
            ]
        )

    # GetAllocatableResources left UNIMPLEMENTED, as on kubelets before 1.21


def test_errors_keep_last_answer_until_stale_then_drop(sock: Path) -> None:
    servicer = _Broken()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    now = [1000.0]
    client = KubeletPodResources(sock, refresh_interval=10, stale_after=30, clock=lambda: now[0])
    try:
        ok = client.refresh()
        assert ok.state == "ok"
        assert ok.allocatable == ()  # UNIMPLEMENTED is not an error
        servicer.fail = True
        now[0] += 20
        kept = client.refresh()
        assert kept.state == "error"
        assert "UNAVAILABLE" in kept.error
        assert len(kept.allocations) == 1  # within stale_after: still the last good answer
        now[0] += 20
        dropped = client.refresh()
        assert dropped.state == "error"
        assert dropped.allocations == ()  # pods must not outlive their allocations for long
        servicer.fail = False
        assert client.refresh().state == "ok"
    finally:
        client.stop()
        server.stop(None)


def test_background_refresher_picks_up_changes(sock: Path, kubelet_server: Any) -> None:
    _, box = kubelet_server
    client = KubeletPodResources(sock, refresh_interval=0.05)
    client.start()
    try:
        box.items = [DeviceAllocation("late", "pod", "c", "nvidia.com/gpu", GPU0)]
        for _ in range(200):
            if [a.namespace for a in client.view().allocations] == ["late"]:
                break
            threading.Event().wait(0.02)
        assert [a.namespace for a in client.view().allocations] == ["late"]
    finally:
        client.stop()


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU0, (GPU0, None)),
        (f"{GPU0}::7", (GPU0, 7)),
        (f"{MIG}::3", (MIG, 3)),
        ("nvidia0", ("nvidia0", None)),
        ("weird::x", ("weird::x", None)),
    ],
)
def test_split_device_id(device_id: str, expected: tuple[str, int | None]) -> None:
    assert split_device_id(device_id) == expected


def test_pod_exists_answers_from_the_last_listing(sock: Path, kubelet_server: Any) -> None:
    """The partition reconciler asks whether an owner pod still exists: yes, no, or unknown without kubelet."""
    client = KubeletPodResources(sock, refresh_interval=60)
    try:
        assert client.pod_exists("ml", "train-0") is None, "no listing yet: unknown, never 'gone'"
        client.refresh()
        assert client.pod_exists("ml", "train-0") is True
        assert client.pod_exists("ml", "train-1") is False
        with kubelet_server[1].lock:
            kubelet_server[1].items = [a for a in kubelet_server[1].items if a.pod != "train-0"]
        client.refresh()
        assert client.pod_exists("ml", "train-0") is False
        kubelet_server[0].stop()
        sock.unlink(missing_ok=True)
        client.refresh()
        assert client.pod_exists("inf", "a") is None, "kubelet gone: unknown, so nothing is reclaimed by mistake"
    finally:
        client.stop()


def test_device_holders_say_when_kubelet_was_asked(sock: Path, kubelet_server: Any) -> None:
    """The time is taken before the List is sent: the answer reflects every Allocate that returned before it."""
    times = iter([100.0, 101.0, 102.0, 103.0])  # before the List, then when it answered (last_success)
    client = KubeletPodResources(sock, refresh_interval=60, clock=lambda: next(times))
    try:
        assert client.device_holders() is None  # not asked yet
        client.refresh()
        listing = client.device_holders()
    finally:
        client.stop()
    assert listing is not None and listing.listed_at == 100.0
    assert client.view().last_success == 101.0
    assert listing.holders[("nvidia.com/mig-3g.71gb", MIG)] == ("nb", "j", "kernel")


def test_an_unchanged_answer_keeps_its_allocations_tuple(sock: Path, kubelet_server: Any) -> None:
    """What is made from the allocations downstream is reused while they are the same tuple: an unchanged List
    must give the same one, a changed List the new allocations."""
    _, box = kubelet_server
    client = KubeletPodResources(sock, refresh_interval=60)
    try:
        first = client.refresh().allocations
        assert client.refresh().allocations is first
        with box.lock:
            box.items = box.items[1:]
        changed = client.refresh().allocations
    finally:
        client.stop()
    assert set(changed) == set(box.items) != set(first)


def test_simulated_kubelet_builds_its_list_once_per_change(sock: Path, kubelet_server: Any) -> None:
    server, box = kubelet_server
    first = server.list_response()
    assert server.list_response() is first  # equal allocations: the reply already made
    with box.lock:
        box.items = box.items[1:]
    changed = server.list_response()
    assert changed is not first
    assert sum(len(c.devices[0].device_ids) for p in changed.pod_resources for c in p.containers) == len(box.items)


class _FrameTap:
    """A unix-socket relay between a client and a server that records the type of every HTTP/2 frame each end
    sends (RFC 9113 section 4.1: a 9-byte header, length in the first three bytes, type in the fourth)."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    PING = 6

    def __init__(self, front: Path, back: Path) -> None:
        self.back = back
        self.sent: dict[str, list[int]] = {"client": [], "server": []}
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(front))
        self._listener.listen()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        """Stop relaying and close every socket the tap opened (none is left for the collector to finalise)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            opened = list(self._sockets)
        for s in opened:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)
        for s in opened:
            s.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.socket(socket.AF_UNIX)
                with self._lock:
                    self._sockets += [client, server]
                server.connect(str(self.back))
                relays = [
                    threading.Thread(target=self._relay, args=(client, server, "client"), daemon=True),
                    threading.Thread(target=self._relay, args=(server, client, "server"), daemon=True),
                ]
                self._threads += relays
                for t in relays:
                    t.start()

    def _relay(self, src: socket.socket, dst: socket.socket, side: str) -> None:
        pending = b""
        preface = side == "client"
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
                pending += data
                if preface:
                    if len(pending) < len(self.PREFACE):
                        continue
                    pending, preface = pending[len(self.PREFACE) :], False
                while len(pending) >= 9 and len(pending) >= 9 + (size := int.from_bytes(pending[:3], "big")):
                    self.sent[side].append(pending[3])
                    pending = pending[9 + size :]


def test_no_bdp_pings_between_the_client_and_the_simulated_kubelet(sock: Path, kubelet_server: Any) -> None:
    """Neither end sends HTTP/2 PINGs (BDP probing is off on both): every ping would wake gRPC's EventEngine
    workers between two refreshes (exporter/attribution/kubelet.py's NO_BDP_PROBE)."""
    front = sock.with_name("tap.sock")
    tap = _FrameTap(front, sock)
    client = KubeletPodResources(front, refresh_interval=60)
    try:
        for _ in range(3):
            assert client.refresh().state == "ok"
    finally:
        client.stop()
        tap.close()
    assert _FrameTap.PING not in tap.sent["client"] and _FrameTap.PING not in tap.sent["server"], tap.sent
    assert 0 in tap.sent["client"] and 0 in tap.sent["server"]  # DATA both ways: the calls went through the tap
