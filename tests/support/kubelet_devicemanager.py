"""A port of kubelet's device manager, the part a device plugin talks to, on the real v1beta1 protos.

Followed: kubernetes/kubernetes, ``pkg/kubelet/cm/devicemanager`` at these commits (each the version of its file
read for this port):

- ``plugin/v1beta1/server.go`` (94bb3ab8f5bd): ``Start`` (mkdir, ``CleanupPluginDirectory``, listen on
  ``kubelet.sock``), ``Stop`` (``disconnectClient`` for every client, then stop serving), ``Register`` (version among
  the supported ones, ``IsExtendedResourceName``, then ``connectClient``);
- ``plugin/v1beta1/handler.go`` (f44969745733): ``connectClient`` (``registerClient`` *before* ``Connect``; a
  failed connect deregisters), ``runClient`` (``c.Run()``, then ``getClient(name)`` - whichever client holds the
  name *now* - is disconnected: a late end of an old stream disconnects a freshly registered client),
  ``disconnectClient`` (``deregisterClient``, then ``Disconnect``);
- ``plugin/v1beta1/client.go`` (b1ce15c54586): ``Connect`` (dial with a 10 s blocking deadline, then
  ``PluginConnected``), ``Run`` (one ``ListAndWatch`` with ``context.Background()``; each response goes to
  ``PluginListAndWatchReceiver``; returns on the first error), ``Disconnect`` (close, ``PluginDisconnected``);
- ``endpoint.go`` (0c19dc02cf01): ``allocate`` and ``getPreferredAllocation`` with ``context.Background()`` (no
  deadline), ``preStartContainer`` with ``KubeletPreStartContainerRPCTimeoutInSecs`` (30 s), every call refused
  once the endpoint is stopped;
- ``manager.go`` (7510f32987fe): ``PluginConnected`` (``GetDevicePluginOptions``, a new endpoint),
  ``PluginDisconnected`` (every device of the resource unhealthy, the endpoint's stop time set),
  ``genericDeviceUpdateCallback`` (healthy and unhealthy sets replaced by each list), ``GetCapacity`` (a resource
  whose endpoint stopped more than ``endpointStopGracePeriod`` ago, 5 min in ``types.go``, leaves capacity),
  ``CleanupPluginDirectory`` (every socket except the checkpoint file), ``devicesToAllocate`` (only healthy,
  unallocated devices; the plugin's preference first) and ``allocateContainerResources``.

Not ported (so not proven here): the checkpoint file and its restore after a restart, topology-manager NUMA
alignment, init-container device reuse, pod admission and the node-status update that carries ``GetCapacity`` to
the scheduler (see docs/kubernetes.md), and kubelet's plugin-watcher registration path (``GetPluginHandler``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.api.v1beta1 import api_pb2_grpc as kpb_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
ENDPOINT_STOP_GRACE_PERIOD = 5 * 60.0  # types.go: endpointStopGracePeriod
PRE_START_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
DIAL_TIMEOUT = 10.0  # client.go: dial

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_qualified_name(value: str) -> bool:
    """k8s.io/apimachinery/pkg/util/validation: IsQualifiedName."""
    prefix, sep, name = value.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.fullmatch(name))


def is_extended_resource_name(name: str) -> bool:
    """pkg/apis/core/v1/helper: IsExtendedResourceName (not native, not ``requests.``, qualified as a quota)."""
    native = "/" not in name or "kubernetes.io/" in name
    return not native and not name.startswith("requests.") and is_qualified_name("requests." + name)


class DeviceManagerError(Exception):
    """An error kubelet's device manager returns (a stopped endpoint, an unregistered or short resource)."""


@dataclass
class Endpoint:
    """endpoint.go: one registered plugin as the manager keeps it."""

    resource: str
    stub: Any
    options: Any
    stop_time: float | None = None

    def stopped(self) -> bool:
        return self.stop_time is not None

    def _check(self) -> None:
        if self.stopped():
            raise DeviceManagerError(f"endpoint {self.resource} has been stopped")

    def get_preferred_allocation(self, available: list[str], must: list[str], size: int) -> Any:
        self._check()
        request = kpb.PreferredAllocationRequest(
            container_requests=[
                kpb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
                )
            ]
        )
        return self.stub.GetPreferredAllocation(request)  # context.Background(): no deadline

    def allocate(self, ids: list[str]) -> Any:
        self._check()
        request = kpb.AllocateRequest(container_requests=[kpb.ContainerAllocateRequest(devices_ids=ids)])
        return self.stub.Allocate(request)  # context.Background(): no deadline

    def pre_start_container(self, ids: list[str]) -> Any:
        self._check()
        return self.stub.PreStartContainer(kpb.PreStartContainerRequest(devices_ids=ids), timeout=PRE_START_TIMEOUT)


class PluginClient:
    """client.go: the connection to one plugin's socket and its ListAndWatch stream."""

    def __init__(self, resource: str, socket: Path, manager: DeviceManager) -> None:
        self.resource = resource
        self.socket = socket
        self._manager = manager
        self.channel: grpc.Channel | None = None
        self.stub: Any = None
        self.stream: Any = None

    def connect(self) -> None:
        channel = grpc.insecure_channel(f"unix:{self.socket}")
        grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT)
        self.channel, self.stub = channel, kpb_grpc.DevicePluginStub(channel)
        self._manager.plugin_connected(self.resource, self)

    def run(self) -> None:
        try:
            self.stream = self.stub.ListAndWatch(kpb.Empty())
            for response in self.stream:
                self._manager.list_and_watch_receiver(self.resource, list(response.devices))
        except (grpc.RpcError, ValueError):  # ValueError: the channel was closed before the stream began
            pass
        self._manager.record("stream ended", self.resource)

    def disconnect(self) -> None:
        if self.channel is not None:
            self.channel.close()  # ends the stream too, as grpc.ClientConn.Close does
            self.channel = None
        self._manager.plugin_disconnected(self.resource)


@dataclass
class DeviceManager:
    """manager.go plus the registration server (server.go, handler.go) it owns."""

    dir: Path
    clock: Callable[[], float] = time.monotonic
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    healthy: dict[str, set[str]] = field(default_factory=dict)
    unhealthy: dict[str, set[str]] = field(default_factory=dict)
    all_devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocated: dict[str, set[str]] = field(default_factory=dict)
    clients: dict[str, PluginClient] = field(default_factory=dict)
    registrations: list[Any] = field(default_factory=list)
    updates: dict[str, list[tuple[float, list[Any]]]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)  # (what, resource), in order
    # set by a test: runClient waits on it after a stream ended, before getClient (a late stream end, on demand)
    stream_end_gate: threading.Event | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    _grpc: grpc.Server | None = None

    def record(self, what: str, resource: str) -> None:
        with self.cond:
            self.events.append((what, resource))
            self.cond.notify_all()

    # ----- server.go ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cleanup_plugin_directory()
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-reg"))
        kpb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.dir / KUBELET_SOCKET}")
        server.start()
        self._grpc = server

    def stop(self) -> None:
        with self.cond:
            clients = list(self.clients.items())
        for name, client in clients:
            self.disconnect_client(name, client)
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait(5)
            self._grpc = None

    def cleanup_plugin_directory(self) -> None:
        for path in self.dir.iterdir():
            if path.name != CHECKPOINT_FILE and path.is_socket():
                path.unlink(missing_ok=True)

    def register(self, request: Any) -> str | None:
        """Register; an error text when refused."""
        with self.cond:
            self.registrations.append(request)
        if request.version not in SUPPORTED_VERSIONS:
            return f"requested API version {request.version!r} is not supported by kubelet"
        if not is_extended_resource_name(request.resource_name):
            return f"the ResourceName {request.resource_name!r} is invalid"
        return self.connect_client(request.resource_name, self.dir / request.endpoint)

    # ----- handler.go --------------------------------------------------------------------------------------------

    def connect_client(self, name: str, socket: Path) -> str | None:
        client = PluginClient(name, socket, self)
        with self.cond:
            self.clients[name] = client  # registerClient
        try:
            client.connect()
        except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
            with self.cond:
                if self.clients.get(name) is client:
                    del self.clients[name]
            return f"failed to connect to the plugin of {name}: {exc}"
        self.record("connected", name)
        threading.Thread(target=self.run_client, args=(name, client), daemon=True).start()
        return None

    def run_client(self, name: str, client: PluginClient) -> None:
        client.run()
        gate = self.stream_end_gate
        if gate is not None:
            gate.wait(60)
        with self.cond:
            current = self.clients.get(name)  # getClient(name): not necessarily the client whose stream ended
        if current is not None:
            self.disconnect_client(name, current)

    def disconnect_client(self, name: str, client: PluginClient) -> None:
        with self.cond:
            self.clients.pop(name, None)  # deregisterClient
        client.disconnect()
        self.record("disconnected", name)

    def client(self, name: str) -> PluginClient | None:
        with self.cond:
            return self.clients.get(name)

    # ----- manager.go --------------------------------------------------------------------------------------------

    def plugin_connected(self, resource: str, client: PluginClient) -> None:
        options = client.stub.GetDevicePluginOptions(kpb.Empty())
        with self.cond:
            self.endpoints[resource] = Endpoint(resource, client.stub, options)
            self.cond.notify_all()

    def plugin_disconnected(self, resource: str) -> None:
        with self.cond:
            endpoint = self.endpoints.get(resource)
            if endpoint is not None:
                self.unhealthy[resource] = self.unhealthy.get(resource, set()) | self.healthy.get(resource, set())
                self.healthy[resource] = set()  # markResourceUnhealthy
                endpoint.stop_time = self.clock()
            self.cond.notify_all()

    def list_and_watch_receiver(self, resource: str, devices: list[Any]) -> None:
        with self.cond:
            self.all_devices[resource] = {d.ID: d for d in devices}
            self.healthy[resource] = {d.ID for d in devices if d.health == "Healthy"}
            self.unhealthy[resource] = {d.ID for d in devices if d.health != "Healthy"}
            self.updates.setdefault(resource, []).append((time.monotonic(), devices))
            self.cond.notify_all()

    def get_capacity(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        """(capacity, allocatable, deleted resources) as the next node-status update would carry them."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        deleted: set[str] = set()
        with self.cond:
            now = self.clock()
            for sets, counts_allocatable in ((self.healthy, True), (self.unhealthy, False)):
                for resource, devices in list(sets.items()):
                    endpoint = self.endpoints.get(resource)
                    expired = endpoint is None or (
                        endpoint.stop_time is not None and now - endpoint.stop_time > ENDPOINT_STOP_GRACE_PERIOD
                    )
                    if expired:
                        self.endpoints.pop(resource, None)
                        del sets[resource]
                        deleted.add(resource)
                        continue
                    capacity[resource] = capacity.get(resource, 0) + len(devices)
                    if counts_allocatable:
                        allocatable[resource] = len(devices)
        return capacity, allocatable, sorted(deleted)

    def endpoint(self, resource: str) -> Endpoint:
        with self.cond:
            endpoint = self.endpoints.get(resource)
        if endpoint is None:
            raise DeviceManagerError(f"unknown Device Plugin {resource}")
        return endpoint

    def devices_to_allocate(self, resource: str, count: int) -> list[str]:
        """devicesToAllocate: healthy minus allocated; the plugin's preference first, then any."""
        with self.cond:
            if resource not in self.healthy:
                raise DeviceManagerError(f"cannot allocate unregistered device {resource}")
            available = sorted(self.healthy[resource] - self.allocated.get(resource, set()))
        if len(available) < count:
            raise DeviceManagerError(f"requested number of devices unavailable for {resource}: {len(available)}")
        endpoint = self.endpoint(resource)
        chosen: list[str] = []
        if count < len(available) and endpoint.options.get_preferred_allocation_available:
            reply = endpoint.get_preferred_allocation(available, [], count)
            chosen = [i for i in reply.container_responses[0].deviceIDs if i in available][:count]
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        with self.cond:
            self.allocated.setdefault(resource, set()).update(chosen)
        return chosen

    def release(self, resource: str, ids: list[str]) -> None:
        with self.cond:
            self.allocated.get(resource, set()).difference_update(ids)


class _Registration(kpb_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._m = manager

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        error = self._m.register(request)
        if error is not None:
            context.abort(grpc.StatusCode.UNKNOWN, error)  # a Go error returned from a handler: Unknown
        return kpb.Empty()
