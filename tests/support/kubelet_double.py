"""A kubelet test double that speaks the real protos: the device-plugin Registration service on
``<dir>/kubelet.sock`` (v1beta1), the calls kubelet makes to a registered plugin (GetDevicePluginOptions, a
ListAndWatch stream per resource, GetPreferredAllocation, Allocate, PreStartContainer), and the pod-resources
PodResourcesLister (v1) that lists which pod holds which device, as kubelet does after admission.

``admit`` does what kubelet's device manager does for one container: pick devices (preferred allocation when the
plugin offers it), Allocate, then list them under the pod. ``restart`` is a kubelet restart: servers stop, every
file in the device-plugins directory is removed, and a new kubelet.sock appears.
"""

from __future__ import annotations

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
from exporter.attribution.api.podresources.v1 import api_pb2 as prpb
from exporter.attribution.api.podresources.v1 import api_pb2_grpc as prpb_grpc


@dataclass
class Plugin:
    """One registered resource as kubelet keeps it."""

    request: Any  # RegisterRequest
    options: Any  # DevicePluginOptions as the plugin answered
    channel: grpc.Channel
    stub: Any
    devices: list[Any] = field(default_factory=list)
    updates: list[tuple[float, list[Any]]] = field(default_factory=list)  # (monotonic time, device list)
    stream: Any = None


class KubeletDouble:
    def __init__(self, plugin_dir: Path, pod_resources_socket: Path) -> None:
        self.dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.registrations: list[Any] = []
        self.plugins: dict[str, Plugin] = {}
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self._cond = threading.Condition()
        self._servers: list[grpc.Server] = []

    # ----- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> KubeletDouble:
        self.dir.mkdir(parents=True, exist_ok=True)
        registration = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-reg"))
        kpb_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix:{self.dir / 'kubelet.sock'}")
        registration.start()
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)
        lister = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="kubelet-pr"))
        prpb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), lister)
        lister.add_insecure_port(f"unix:{self.pod_resources_socket}")
        lister.start()
        self._servers = [registration, lister]
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=None).wait(5)
        self._servers = []
        with self._cond:
            plugins, self.plugins = list(self.plugins.values()), {}
        for plugin in plugins:
            if plugin.stream is not None:
                plugin.stream.cancel()
            plugin.channel.close()

    def restart(self) -> None:
        """kubelet restarting: its servers go, the device-plugins directory is emptied, a new kubelet.sock comes."""
        self.stop()
        for entry in self.dir.iterdir():
            entry.unlink()
        self.start()

    # ----- registration and the plugin's stream --------------------------------------------------------------

    def _register(self, request: Any) -> None:
        channel = grpc.insecure_channel(f"unix:{self.dir / request.endpoint}")
        stub = kpb_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(kpb.Empty(), timeout=10)
        plugin = Plugin(request, options, channel, stub)
        with self._cond:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = plugin
            self.registrations.append(request)
            self._cond.notify_all()
        if old is not None and old.stream is not None:
            old.stream.cancel()
        threading.Thread(target=self._watch, args=(plugin,), daemon=True).start()

    def _watch(self, plugin: Plugin) -> None:
        plugin.stream = plugin.stub.ListAndWatch(kpb.Empty())
        try:
            for response in plugin.stream:
                with self._cond:
                    plugin.devices = list(response.devices)
                    plugin.updates.append((time.monotonic(), list(response.devices)))
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # cancelled, or the plugin went away

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"kubelet double: {what} did not happen within {timeout}s")

    def devices(self, resource: str) -> list[Any]:
        with self._cond:
            plugin = self.plugins.get(resource)
            return list(plugin.devices) if plugin is not None else []

    def health(self, resource: str) -> dict[str, str]:
        return {d.ID: d.health for d in self.devices(resource)}

    def healthy(self, resource: str) -> list[str]:
        return [d.ID for d in self.devices(resource) if d.health == "Healthy"]

    def plugin(self, resource: str) -> Plugin:
        with self._cond:
            return self.plugins[resource]

    # ----- what kubelet's device manager does for a container ----------------------------------------------

    def preferred(self, resource: str, available: list[str], size: int, must: list[str] | None = None) -> list[str]:
        reply = self.plugin(resource).stub.GetPreferredAllocation(
            kpb.PreferredAllocationRequest(
                container_requests=[
                    kpb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
                    )
                ]
            ),
            timeout=30,
        )
        return list(reply.container_responses[0].deviceIDs)

    def allocate(self, resource: str, ids: list[str]) -> Any:
        reply = self.plugin(resource).stub.Allocate(
            kpb.AllocateRequest(container_requests=[kpb.ContainerAllocateRequest(devices_ids=ids)]), timeout=30
        )
        return reply.container_responses[0]

    def pre_start(self, resource: str, ids: list[str]) -> None:
        self.plugin(resource).stub.PreStartContainer(kpb.PreStartContainerRequest(devices_ids=ids), timeout=30)

    def allocated(self) -> set[tuple[str, str]]:
        with self._cond:
            return {
                (resource, i)
                for containers in self.pods.values()
                for resources in containers.values()
                for resource, ids in resources.items()
                for i in ids
            }

    def admit(self, namespace: str, pod: str, container: str, resource: str, count: int) -> tuple[list[str], Any]:
        """Pick ``count`` healthy free devices (the plugin's preference first), Allocate, list them under the pod."""
        taken = self.allocated()
        free = [i for i in self.healthy(resource) if (resource, i) not in taken]
        if len(free) < count:
            raise AssertionError(f"kubelet double: {resource}: {len(free)} free healthy devices, {count} asked")
        ids = (
            self.preferred(resource, free, count)
            if self.plugin(resource).options.get_preferred_allocation_available
            else free[:count]
        )
        response = self.allocate(resource, ids)
        with self._cond:
            self.pods.setdefault((namespace, pod), {}).setdefault(container, {})[resource] = ids
        return ids, response

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._cond:
            self.pods.pop((namespace, pod), None)

    def list_response(self) -> Any:
        with self._cond:
            pods = {k: {c: dict(r) for c, r in v.items()} for k, v in self.pods.items()}
        return prpb.ListPodResourcesResponse(
            pod_resources=[
                prpb.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[
                        prpb.ContainerResources(
                            name=cname,
                            devices=[prpb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in res.items()],
                        )
                        for cname, res in containers.items()
                    ],
                )
                for (namespace, name), containers in sorted(pods.items())
            ]
        )


class _Registration(kpb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._k = kubelet

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if "/" not in request.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resource name needs a domain")
        self._k._register(request)
        return kpb.Empty()


class _Lister(prpb_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._k = kubelet

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._k.list_response()

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return prpb.AllocatableResourcesResponse()
