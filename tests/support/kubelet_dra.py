"""A kubelet double for DRA kubelet plugins, speaking the vendored protos (container/dra/api) the way kubelet does.

Follows kubernetes/kubernetes (files as stored at the commits named; they match v1.35-v1.36 behaviour):

- plugin watcher, pkg/kubelet/pluginmanager (pluginwatcher/plugin_watcher.go @02910b7, operationexecutor/
  operation_generator.go @04791b4, reconciler/reconciler.go @0715943): every unix socket in the registry dir whose
  name does not start with "." is a plugin; kubelet dials it (10 s), calls Registration.GetInfo (1 s), looks up
  the handler for PluginInfo.type ("DRAPlugin"; any other type is refused through NotifyRegistrationStatus), takes
  the socket itself as endpoint when PluginInfo.endpoint is empty, validates, registers, then calls
  NotifyRegistrationStatus(plugin_registered=true) (5 s). A socket that disappears deregisters the plugin; one
  re-created at the same path (a new timestamp) is deregistered and registered again.
- DRA plugin manager, pkg/kubelet/cm/dra/plugin (dra_plugin_manager.go @0062353, dra_plugin.go; TestPickHealthService
  of the newest dra_plugin_manager_test.go): the first of the plugin's supported_versions that kubelet supports
  ("v1.DRAPlugin", "v1beta1.DRAPlugin") is used for every call; none is a validation error. Each call has the
  plugin's client timeout (45 s by default). The health service is v1.DRAResourceHealth when offered (kubelet 1.37),
  else v1alpha1.DRAResourceHealth (1.34-1.36, gate ResourceHealthStatus); kubelet 1.34-1.36 only knows v1alpha1.
- DRA manager, pkg/kubelet/cm/dra/manager.go (@001332b): one NodePrepareResources per driver with every claim of
  the pod not yet prepared, each as (namespace, uid, name); an error of the call fails the pod's preparation, a
  result with an error names the claim ("NodePrepareResources failed for ResourceClaim <name>: <error>"), a
  result for an unknown uid or a missing result ("skipped N ResourceClaims") is an error too; unprepare the same.
  A health stream's devices replace the driver's health cache (healthinfo.go; default timeout 30 s).

What it does not prove: kubelet's own state (claim info checkpoint, pod references, retries with back-off, the
ResourceSlice wiping 30 s after a driver's last plugin goes), CDI injection into containers, and the timing of
the fsnotify watch (``poll`` scans the directory when the test says so).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from container.dra.api.dra.v1 import api_pb2 as dra_v1
from container.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from container.dra.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from container.dra.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from container.dra.api.dra_health.v1 import api_pb2 as health_v1
from container.dra.api.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from container.dra.api.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from container.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from container.dra.api.pluginregistration.v1 import api_pb2 as reg
from container.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

SERVICES = {"v1.DRAPlugin": (dra_v1, dra_v1_grpc), "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc)}
HEALTH = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc),
}
DIAL_TIMEOUT, GET_INFO_TIMEOUT, NOTIFY_TIMEOUT, CALL_TIMEOUT = 10.0, 1.0, 5.0, 45.0


class RegistrationError(Exception):
    pass


class PrepareError(Exception):
    """What kubelet reports on the pod when preparing or unpreparing its claims fails."""


@dataclass
class Plugin:
    driver: str
    socket: Path
    stamp: tuple[int, int]  # (inode, mtime): a re-created socket is a new plugin instance
    endpoint: str
    service: str
    health: str | None
    channel: grpc.Channel


@dataclass(frozen=True)
class Claim:
    namespace: str
    uid: str
    name: str


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _sockets(directory: Path) -> list[Path]:
    found = []
    for root, _, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            try:
                if not name.startswith(".") and stat.S_ISSOCK(path.stat().st_mode):
                    found.append(path)
            except FileNotFoundError:
                continue
    return sorted(found)


class KubeletDra:
    def __init__(self, registry_dir: Path, *, call_timeout: float = CALL_TIMEOUT) -> None:
        self.registry_dir = registry_dir
        self.call_timeout = call_timeout
        self.plugins: dict[str, Plugin] = {}  # driver name -> its (latest) plugin
        self.refused: dict[Path, str] = {}  # socket -> why kubelet did not register it
        self.registry_dir.mkdir(parents=True, exist_ok=True)

    # ----- the plugin watcher ----------------------------------------------------------------------------------

    def register(self) -> list[str]:
        """One pass of the watcher and reconciler: deregister what went, register what is new. The drivers known."""
        present = {p: _stamp(p) for p in _sockets(self.registry_dir)}
        for driver, plugin in list(self.plugins.items()):
            if present.get(plugin.socket) != plugin.stamp:
                self._deregister(driver)
        known = {p.socket for p in self.plugins.values()}
        for socket, stamp in present.items():
            if socket not in known:
                try:
                    self._register(socket, stamp)
                except RegistrationError as e:
                    self.refused[socket] = str(e)
        return sorted(self.plugins)

    def _register(self, socket: Path, stamp: tuple[int, int]) -> None:
        channel = grpc.insecure_channel(f"unix:{socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT)
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            why = self._validate(info, info.endpoint or str(socket))
            if why:
                stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=False, error=why), timeout=NOTIFY_TIMEOUT
                )
                raise RegistrationError(why)
            endpoint = info.endpoint or str(socket)
            service = next(v for v in info.supported_versions if v in SERVICES)
            health = next((h for h in HEALTH if h in info.supported_versions), None)
            self.plugins[info.name] = Plugin(
                info.name, socket, stamp, endpoint, service, health, grpc.insecure_channel(f"unix:{endpoint}")
            )
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=NOTIFY_TIMEOUT)
        except grpc.FutureTimeoutError as e:
            raise RegistrationError(f"RegisterPlugin error -- dial failed at socket {socket}") from e
        except grpc.RpcError as e:
            raise RegistrationError(f"RegisterPlugin error -- {e.code().name}: {e.details()}") from e
        finally:
            channel.close()

    def _validate(self, info: Any, endpoint: str) -> str:
        if info.type != "DRAPlugin":
            return f"RegisterPlugin error -- no handler registered for plugin type: {info.type}"
        if not info.supported_versions:
            return "RegisterPlugin error -- plugin validation failed with err: empty list of supported gRPC services"
        if not any(v in SERVICES for v in info.supported_versions):
            return (
                "RegisterPlugin error -- plugin validation failed with err: none of services supported by the plugin "
                f"({list(info.supported_versions)}) are supported by the kubelet ({list(SERVICES)})"
            )
        if info.name in self.plugins and self.plugins[info.name].endpoint == endpoint:
            return f"endpoint {endpoint} already registered for DRA driver plugin {info.name}"
        return ""

    def _deregister(self, driver: str) -> None:
        plugin = self.plugins.pop(driver)
        plugin.channel.close()

    def restart(self) -> list[str]:
        """A kubelet restart: every connection dropped, the registry dir walked again from scratch."""
        for driver in list(self.plugins):
            self._deregister(driver)
        self.refused.clear()
        return self.register()

    def close(self) -> None:
        for driver in list(self.plugins):
            self._deregister(driver)

    # ----- the DRA manager -------------------------------------------------------------------------------------

    def _plugin(self, driver: str) -> Plugin:
        if driver not in self.plugins:
            raise PrepareError(f"DRA driver {driver} is not registered")
        return self.plugins[driver]

    def prepare(self, driver: str, claims: list[Claim]) -> dict[str, list[Any]]:
        """NodePrepareResources for these claims: claim uid -> the Devices the plugin returned."""
        return self._call(driver, claims, "NodePrepareResources")

    def unprepare(self, driver: str, claims: list[Claim]) -> None:
        self._call(driver, claims, "NodeUnprepareResources")

    def _call(self, driver: str, claims: list[Claim], method: str) -> dict[str, list[Any]]:
        plugin = self._plugin(driver)
        pb, pb_grpc = SERVICES[plugin.service]
        request = getattr(pb, f"{method}Request")(
            claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        try:
            response = getattr(pb_grpc.DRAPluginStub(plugin.channel), method)(request, timeout=self.call_timeout)
        except grpc.RpcError as e:
            raise PrepareError(f"{method}: rpc error: code = {e.code().name} desc = {e.details()}") from e
        by_uid = {c.uid: c for c in claims}
        out = {}
        for uid, result in response.claims.items():
            if uid not in by_uid:
                raise PrepareError(f"{method} returned result for unknown claim UID {uid}")
            if result.error:
                raise PrepareError(f"{method} failed for ResourceClaim {by_uid[uid].name}: {result.error}")
            out[uid] = list(getattr(result, "devices", ()))
        if missing := len(claims) - len(response.claims):
            raise PrepareError(f"{method} skipped {missing} ResourceClaims")
        return out

    def watch_health(self, driver: str, timeout: float | None = None) -> Iterator[Any]:
        """The plugin's NodeWatchResources stream, each message as it comes (every device of the driver)."""
        plugin = self._plugin(driver)
        if plugin.health is None:
            raise PrepareError(f"DRA driver {driver} offers no DRAResourceHealth service")
        pb, pb_grpc = HEALTH[plugin.health]
        stream = pb_grpc.DRAResourceHealthStub(plugin.channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=timeout
        )
        try:
            yield from stream
        finally:
            stream.cancel()
