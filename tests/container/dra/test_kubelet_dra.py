"""tests/support/kubelet_dra.py against a minimal DRA plugin written here: registration through the plugin
watcher's calls, version negotiation, the prepare/unprepare batch and its per-claim errors, a plugin socket that
goes and comes back, and the health stream."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from container.dra.api.dra.v1 import api_pb2 as v1
from container.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from container.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from container.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from container.dra.api.dra_health.v1alpha1 import api_pb2 as health
from container.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from container.dra.api.pluginregistration.v1 import api_pb2 as reg
from container.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.support.kubelet_dra import Claim, KubeletDra, PrepareError

DRIVER = "gpu.xpu-runtime-kit.io"


class MiniPlugin:
    """Registration on <registry>/<driver>-reg.sock, DRA on <plugins>/dra.sock (the kubelet plugin helper's layout)."""

    def __init__(self, root: Path, versions: list[str], *, failing: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.registry = root / "plugins_registry"
        self.dra = root / "plugins" / DRIVER / "dra.sock"
        self.versions, self.failing = versions, failing
        self.statuses: list[tuple[bool, str]] = []
        self.prepared: list[list[tuple[str, str, str]]] = []
        self.servers: list[grpc.Server] = []

    def start(self) -> MiniPlugin:
        self.registry.mkdir(parents=True, exist_ok=True)
        self.dra.parent.mkdir(parents=True, exist_ok=True)
        plugin = self

        class Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
            def GetInfo(self, request: Any, context: Any) -> Any:
                return reg.PluginInfo(
                    type="DRAPlugin", name=DRIVER, endpoint=str(plugin.dra), supported_versions=plugin.versions
                )

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                plugin.statuses.append((request.plugin_registered, request.error))
                return reg.RegistrationStatusResponse()

        def servicer(pb: Any, base: Any) -> Any:
            class Node(base):  # type: ignore[misc,valid-type]
                def NodePrepareResources(self, request: Any, context: Any) -> Any:
                    plugin.prepared.append([(c.namespace, c.uid, c.name) for c in request.claims])
                    out = pb.NodePrepareResourcesResponse()
                    for c in request.claims:
                        if c.name in plugin.failing:
                            out.claims[c.uid].error = "no room on the card"
                        else:
                            out.claims[c.uid].devices.add(
                                pool_name="n", device_name="gpu-0", cdi_device_ids=[f"x/gpu={c.uid}"]
                            )
                    return out

                def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
                    out = pb.NodeUnprepareResourcesResponse()
                    for c in request.claims:
                        out.claims[c.uid].error = ""
                    return out

            return Node()

        class Health(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
            def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
                for state in (health.HEALTHY, health.UNHEALTHY):
                    device = health.DeviceHealth(
                        device=health.DeviceIdentifier(pool_name="n", device_name="gpu-0"), health=state
                    )
                    yield health.NodeWatchResourcesResponse(devices=[device])

        dra = grpc.server(ThreadPoolExecutor(4))
        v1_grpc.add_DRAPluginServicer_to_server(servicer(v1, v1_grpc.DRAPluginServicer), dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(servicer(v1beta1, v1beta1_grpc.DRAPluginServicer), dra)
        health_grpc.add_DRAResourceHealthServicer_to_server(Health(), dra)
        dra.add_insecure_port(f"unix:{self.dra}")
        registration = grpc.server(ThreadPoolExecutor(2))
        reg_grpc.add_RegistrationServicer_to_server(Registration(), registration)
        registration.add_insecure_port(f"unix:{self.registry / (DRIVER + '-reg.sock')}")
        for server in (dra, registration):
            server.start()
        self.servers = [dra, registration]
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop(None).wait(5)
        (self.registry / (DRIVER + "-reg.sock")).unlink(missing_ok=True)
        self.dra.unlink(missing_ok=True)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))  # unix socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_registration_picks_the_plugins_first_version_kubelet_knows(root: Path) -> None:
    plugin = MiniPlugin(root, ["v1beta1.DRAPlugin", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]).start()
    kubelet = KubeletDra(plugin.registry)
    try:
        assert kubelet.register() == [DRIVER]
        assert plugin.statuses == [(True, "")]
        assert (kubelet.plugins[DRIVER].service, kubelet.plugins[DRIVER].health) == (
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
        )
        assert kubelet.plugins[DRIVER].endpoint == str(plugin.dra)
    finally:
        kubelet.close()
        plugin.stop()


def test_a_plugin_with_no_version_kubelet_knows_is_told_so(root: Path) -> None:
    plugin = MiniPlugin(root, ["v9.DRAPlugin"]).start()
    kubelet = KubeletDra(plugin.registry)
    try:
        assert kubelet.register() == []
        ((registered, error),) = plugin.statuses
        assert not registered and "none of services supported by the plugin" in error
    finally:
        kubelet.close()
        plugin.stop()


def test_prepare_sends_one_batch_and_a_claims_error_fails_it(root: Path) -> None:
    plugin = MiniPlugin(root, ["v1.DRAPlugin"], failing={"b"}).start()
    kubelet = KubeletDra(plugin.registry)
    try:
        kubelet.register()
        a = Claim("team", "uid-a", "a")
        devices = kubelet.prepare(DRIVER, [a])
        assert [d.cdi_device_ids for d in devices["uid-a"]] == [["x/gpu=uid-a"]]
        with pytest.raises(PrepareError, match="NodePrepareResources failed for ResourceClaim b: no room on the card"):
            kubelet.prepare(DRIVER, [a, Claim("team", "uid-b", "b")])
        assert plugin.prepared[-1] == [("team", "uid-a", "a"), ("team", "uid-b", "b")]
        kubelet.unprepare(DRIVER, [a])
    finally:
        kubelet.close()
        plugin.stop()


def test_a_plugin_that_goes_is_deregistered_and_one_that_comes_back_registers_again(root: Path) -> None:
    plugin = MiniPlugin(root, ["v1.DRAPlugin"]).start()
    kubelet = KubeletDra(plugin.registry)
    try:
        kubelet.register()
        plugin.stop()
        assert kubelet.register() == []
        with pytest.raises(PrepareError, match="not registered"):
            kubelet.prepare(DRIVER, [Claim("team", "u", "c")])
        plugin = MiniPlugin(root, ["v1.DRAPlugin"]).start()
        assert kubelet.register() == [DRIVER]
        assert kubelet.restart() == [DRIVER]
        assert plugin.statuses == [(True, ""), (True, "")]
    finally:
        kubelet.close()
        plugin.stop()


def test_the_health_stream_is_read_from_the_service_the_plugin_offers(root: Path) -> None:
    plugin = MiniPlugin(root, ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]).start()
    kubelet = KubeletDra(plugin.registry)
    try:
        kubelet.register()
        states = [m.devices[0].health for m in kubelet.watch_health(DRIVER, timeout=5)]
        assert states == [health.HEALTHY, health.UNHEALTHY]
    finally:
        kubelet.close()
        plugin.stop()
