"""A kubelet test double for device plugins: kubelet's device manager as ported in kubelet_devicemanager.py (the
Registration service on ``<dir>/kubelet.sock``, one client and ListAndWatch stream per resource with kubelet's
runClient/disconnectClient rules, the endpoint stop grace period, Allocate and GetPreferredAllocation with no
deadline), plus the pod-resources PodResourcesLister (v1) that lists which pod holds which device.

``admit`` does what the device manager does for one container: pick healthy free devices (the plugin's preference
first), Allocate, then list them under the pod. ``restart`` is a kubelet restart: the manager stops (every client
disconnected), the registration server goes, ``CleanupPluginDirectory`` removes every socket but the checkpoint,
and a new kubelet.sock appears. ``drop_stream`` is kubelet's ``disconnectClient`` of a resource's current client
while kubelet keeps running (what ``runClient`` does when an old stream's end is processed after a new
registration). What it does not prove is listed in kubelet_devicemanager.py and docs/kubernetes.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from exporter.attribution.api.podresources.v1 import api_pb2 as prpb
from exporter.attribution.api.podresources.v1 import api_pb2_grpc as prpb_grpc
from tests.support.kubelet_devicemanager import DeviceManager, DeviceManagerError, Endpoint


@dataclass
class Plugin:
    """One registered resource as kubelet keeps it."""

    request: Any  # the RegisterRequest that made it
    endpoint: Endpoint
    devices: list[Any]
    updates: list[tuple[float, list[Any]]]  # (monotonic time, device list) of every ListAndWatch response

    @property
    def options(self) -> Any:
        return self.endpoint.options

    @property
    def stub(self) -> Any:
        return self.endpoint.stub


class KubeletDouble:
    def __init__(
        self, plugin_dir: Path, pod_resources_socket: Path, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.manager = DeviceManager(plugin_dir, clock=clock)
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self._lister: grpc.Server | None = None

    @property
    def _cond(self) -> threading.Condition:
        return self.manager.cond

    @property
    def registrations(self) -> list[Any]:
        with self._cond:
            return list(self.manager.registrations)

    @property
    def plugins(self) -> dict[str, Plugin]:
        with self._cond:
            return {name: self._plugin(name) for name in self.manager.endpoints}

    def _plugin(self, name: str) -> Plugin:
        endpoint = self.manager.endpoints[name]
        request = next(r for r in reversed(self.manager.registrations) if r.resource_name == name)
        devices = list(self.manager.all_devices.get(name, {}).values()) if not endpoint.stopped() else []
        return Plugin(request, endpoint, devices, list(self.manager.updates.get(name, [])))

    # ----- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> KubeletDouble:
        self.manager.start()
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)
        lister = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="kubelet-pr"))
        prpb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), lister)
        lister.add_insecure_port(f"unix:{self.pod_resources_socket}")
        lister.start()
        self._lister = lister
        return self

    def stop(self) -> None:
        self.manager.stop()
        if self._lister is not None:
            self._lister.stop(grace=None).wait(5)
            self._lister = None

    def restart(self) -> None:
        """kubelet restarting: the manager stops, then starts again (which empties the directory of sockets)."""
        self.stop()
        with self._cond:
            self.manager.endpoints.clear()
            self.manager.healthy.clear()
            self.manager.unhealthy.clear()
            self.manager.all_devices.clear()
        self.start()

    def drop_stream(self, resource: str) -> None:
        """disconnectClient on the resource's current client; kubelet.sock stays."""
        client = self.manager.client(resource)
        assert client is not None, f"kubelet double: no client for {resource}"
        self.manager.disconnect_client(resource, client)

    def capacity(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        return self.manager.get_capacity()

    # ----- what kubelet holds --------------------------------------------------------------------------------

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"kubelet double: {what} did not happen within {timeout}s")

    def devices(self, resource: str) -> list[Any]:
        """The devices of the resource's last list; none while its endpoint is stopped."""
        with self._cond:
            endpoint = self.manager.endpoints.get(resource)
            if endpoint is None or endpoint.stopped():
                return []
            return list(self.manager.all_devices.get(resource, {}).values())

    def health(self, resource: str) -> dict[str, str]:
        return {d.ID: d.health for d in self.devices(resource)}

    def healthy(self, resource: str) -> list[str]:
        with self._cond:
            return sorted(self.manager.healthy.get(resource, set()))

    def plugin(self, resource: str) -> Plugin:
        with self._cond:
            return self._plugin(resource)

    def events(self) -> list[tuple[str, str]]:
        with self._cond:
            return list(self.manager.events)

    # ----- what kubelet's device manager does for a container ----------------------------------------------

    def preferred(self, resource: str, available: list[str], size: int, must: list[str] | None = None) -> list[str]:
        reply = self.manager.endpoint(resource).get_preferred_allocation(available, must or [], size)
        return list(reply.container_responses[0].deviceIDs)

    def allocate(self, resource: str, ids: list[str]) -> Any:
        """Allocate as endpoint.go calls it: no deadline (kubelet waits as long as the plugin takes)."""
        return self.manager.endpoint(resource).allocate(ids).container_responses[0]

    def pre_start(self, resource: str, ids: list[str]) -> None:
        self.manager.endpoint(resource).pre_start_container(ids)

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
        """devicesToAllocate, then Allocate; on success the devices are listed under the pod."""
        with self._cond:
            held = {i for r, i in self.allocated() if r == resource}
            self.manager.allocated[resource] = held
        try:
            ids = self.manager.devices_to_allocate(resource, count)
        except DeviceManagerError as exc:
            raise AssertionError(f"kubelet double: {exc}") from None
        try:
            response = self.allocate(resource, ids)
        except grpc.RpcError:
            self.manager.release(resource, ids)
            raise
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


class _Lister(prpb_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._k = kubelet

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._k.list_response()

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return prpb.AllocatableResourcesResponse()
