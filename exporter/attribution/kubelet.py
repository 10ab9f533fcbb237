"""kubelet pod-resources client (v1 PodResourcesLister: List and GetAllocatableResources) with a background refresh.

Scrapes never call kubelet: a thread refreshes the cached device allocations every ``refresh_interval`` seconds.
A missing socket means "not a Kubernetes node" and is reported once at info level. When kubelet restarts it
replaces its socket; the client notices the new inode and opens a fresh channel at once instead of waiting out
gRPC's reconnect back-off. After a failed refresh the last good allocations are kept for ``stale_after`` seconds,
then dropped, so pod labels never outlive their pods for long.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog

if TYPE_CHECKING:
    from exporter.attribution.api.podresources.v1.api_pb2_grpc import PodResourcesListerStub

log = structlog.get_logger("kubelet")

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # kubelet's own limit for this API
# HTTP/2 BDP probing off, on this client and on the simulated kubelet's server. With it on, each end pings the other
# when a call's data arrives and again on its own timer (about six PING frames per refresh), and every ping wakes
# gRPC's EventEngine workers, which then back off from 15 ms again. The probe only tunes flow-control windows for
# throughput, which small replies over a local socket do not need: a 6 MB List reply is no slower without it.
NO_BDP_PROBE = ("grpc.http2.bdp_probe", 0)


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One device id that kubelet gave one container, exactly as kubelet reports it."""

    namespace: str
    pod: str
    container: str
    resource_name: str  # e.g. nvidia.com/gpu, nvidia.com/mig-1g.18gb
    device_id: str  # e.g. GPU-<uuid>, MIG-<uuid>, GPU-<uuid>::3 (shared replica), nvidia0


@dataclass(frozen=True, slots=True)
class DeviceListing:
    """Which pod and container kubelet lists each device under, and when the List was sent: kubelet's answer
    reflects every Allocate that returned before that time, and maybe none after it."""

    holders: Mapping[tuple[str, str], tuple[str, str, str]]  # (resource name, device id) -> (namespace, pod, container)
    listed_at: float  # unix time


@dataclass(frozen=True, slots=True)
class PodResourcesView:
    state: str  # "ok", "absent" (no socket: not a Kubernetes node), "error", "stopped" (never refreshed)
    allocations: tuple[DeviceAllocation, ...] = ()
    allocatable: tuple[tuple[str, str], ...] = ()  # (resource_name, device_id)
    pods: frozenset[tuple[str, str]] = frozenset()  # (namespace, name) of every pod kubelet listed
    last_success: float | None = None  # unix time
    listed_at: float | None = None  # unix time the List behind ``allocations`` was sent
    error: str = ""
    refreshes: int = 0
    failures: int = 0


class KubeletPodResources:
    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        *,
        refresh_interval: float = 10.0,
        call_timeout: float = 5.0,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if refresh_interval <= 0:
            raise ValueError("refresh_interval must be > 0")
        self.socket_path = socket_path
        self.refresh_interval = refresh_interval
        self.call_timeout = call_timeout
        self.stale_after = stale_after if stale_after is not None else 3 * refresh_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._view = PodResourcesView(state="stopped")
        self._channel: grpc.Channel | None = None
        self._inode: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshes = 0
        self._failures = 0
        # The last List reply and what it was turned into: an unchanged reply keeps the same tuple, so what is made
        # from the allocations (attribution, pod series) can tell "unchanged" by identity.
        self._last_list: tuple[object, tuple[tuple[DeviceAllocation, ...], frozenset[tuple[str, str]]]] | None = None

    # ----- public ------------------------------------------------------------------------------------------

    def view(self) -> PodResourcesView:
        with self._lock:
            return self._view

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet-pod-resources", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._close_channel()

    def refresh(self) -> PodResourcesView:
        """One refresh now, on the calling thread (the background loop calls this; tests call it directly)."""
        view = self._refresh()
        with self._lock:
            self._view = view
        return view

    # ----- internals ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # the refresher must outlive any surprise; the view says what went wrong
                log.exception("pod-resources refresh failed unexpectedly")
            self._stop.wait(self.refresh_interval)

    def _refresh(self) -> PodResourcesView:
        previous = self.view()
        self._refreshes += 1
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            self._close_channel()
            if previous.state != "absent":
                log.info("no kubelet pod-resources socket; kubelet allocations off", path=str(self.socket_path))
            return PodResourcesView(state="absent", refreshes=self._refreshes, failures=self._failures)
        except OSError as exc:
            return self._failed(previous, f"cannot stat {self.socket_path}: {exc.strerror}")
        inode = (st.st_dev, st.st_ino)
        if self._channel is None or inode != self._inode:
            if self._channel is not None:
                log.info("kubelet pod-resources socket replaced; reconnecting", path=str(self.socket_path))
            self._close_channel()
            self._channel = grpc.insecure_channel(
                f"unix:{self.socket_path}",
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.enable_retries", 0),
                    NO_BDP_PROBE,
                ],
            )
            self._inode = inode
        stub = _stub(self._channel)
        listed_at = self._clock()  # before the call: the answer is at least this fresh
        try:
            allocations, pods = self._list(stub)
            allocatable = self._allocatable(stub)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            name = code.name if code is not None else "UNKNOWN"
            return self._failed(previous, f"{name}: {exc.details() if hasattr(exc, 'details') else exc}")
        if previous.state != "ok":
            log.info("kubelet pod-resources connected", path=str(self.socket_path), allocations=len(allocations))
        return PodResourcesView(
            state="ok",
            allocations=allocations,
            allocatable=allocatable,
            pods=pods,
            last_success=self._clock(),
            listed_at=listed_at,
            refreshes=self._refreshes,
            failures=self._failures,
        )

    def _failed(self, previous: PodResourcesView, error: str) -> PodResourcesView:
        self._failures += 1
        if previous.state != "error" or previous.error.split(":")[0] != error.split(":")[0]:
            log.warning("kubelet pod-resources refresh failed; keeping the last answer for a while", error=error)
        keep = previous.last_success is not None and self._clock() - previous.last_success <= self.stale_after
        return PodResourcesView(
            state="error",
            allocations=previous.allocations if keep else (),
            allocatable=previous.allocatable if keep else (),
            pods=previous.pods if keep else frozenset(),
            last_success=previous.last_success,
            listed_at=previous.listed_at if keep else None,
            error=error,
            refreshes=self._refreshes,
            failures=self._failures,
        )

    def _list(self, stub: PodResourcesListerStub) -> tuple[tuple[DeviceAllocation, ...], frozenset[tuple[str, str]]]:
        from exporter.attribution.api.podresources.v1 import api_pb2

        reply = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.call_timeout)
        last = self._last_list
        if last is not None and last[0] == reply:
            return last[1]
        out: list[DeviceAllocation] = []
        pods = frozenset((pod.namespace, pod.name) for pod in reply.pod_resources)
        for pod in reply.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    out.extend(
                        DeviceAllocation(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
                        for device_id in devices.device_ids
                    )
        self._last_list = (reply, (tuple(out), pods))
        return self._last_list[1]

    def pod_exists(self, namespace: str, name: str) -> bool | None:
        """Whether kubelet lists the pod; None when kubelet's answer is not current (absent, failing, not yet)."""
        view = self.view()
        if view.state != "ok":
            return None
        return (namespace, name) in view.pods

    def device_holders(self) -> DeviceListing | None:
        """Every device kubelet lists, with its pod and container, and when that List was sent; None when kubelet's
        answer is not current (absent, failing, not yet)."""
        view = self.view()
        if view.state != "ok" or view.listed_at is None:
            return None
        holders = {(a.resource_name, a.device_id): (a.namespace, a.pod, a.container) for a in view.allocations}
        return DeviceListing(holders, view.listed_at)

    def _allocatable(self, stub: PodResourcesListerStub) -> tuple[tuple[str, str], ...]:
        from exporter.attribution.api.podresources.v1 import api_pb2

        try:
            reply = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=self.call_timeout)
        except grpc.RpcError as exc:
            if hasattr(exc, "code") and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return ()  # kubelet before 1.21, or the feature gate off
            raise
        return tuple((d.resource_name, i) for d in reply.devices for i in d.device_ids)

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._inode = None


def _stub(channel: grpc.Channel) -> PodResourcesListerStub:
    from exporter.attribution.api.podresources.v1 import api_pb2_grpc

    return api_pb2_grpc.PodResourcesListerStub(channel)


def split_device_id(device_id: str) -> tuple[str, int | None]:
    """``GPU-x::3`` -> (``GPU-x``, 3): the NVIDIA device plugin names shared (time-sliced/MPS) replicas this way."""
    base, sep, replica = device_id.partition("::")
    if sep and replica.isdigit():
        return base, int(replica)
    return device_id, None
