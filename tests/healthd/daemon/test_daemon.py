"""The component list: every component builds from a default node context (a simulated card, a temporary state
directory), alone or after the ones before it, and starts and stops; built in order, the endpoints serve what the
components before them offer, and the node's questions are answered by the components that know."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from exporter import inflight
from exporter.backends.simulated import SimulatedBackend
from healthd.attribution.component import AttributionComponent
from healthd.component import Component
from healthd.daemon.daemon import COMPONENTS, Daemon, build_components
from healthd.daemon.health import HealthComponent
from healthd.daemon.metrics import MetricsEndpoint
from healthd.daemon.rpc import RpcEndpoints
from healthd.node import Builder, Node
from healthd.partition.component import PartitionsComponent
from tests.support.node import node_on


def _node(tmp_path: Path) -> Node:
    return node_on(SimulatedBackend.from_name("h200x1"), tmp_path / "state", runtime_dir=tmp_path / "run")


async def _start_and_stop(components: tuple[Component, ...]) -> None:
    for component in components:
        await asyncio.wait_for(component.start(), 30)
    for component in reversed(components):
        await asyncio.wait_for(component.stop(), 10)


def _close(node: Node) -> None:
    """What building alone opened: the metrics port is bound when its endpoint is made."""
    metrics = node.built(MetricsEndpoint)
    if metrics is not None:
        metrics.http.server_close()


def _name(build: Builder) -> str:
    return str(getattr(build, "__module__", build))


@pytest.mark.parametrize("build", COMPONENTS, ids=_name)
def test_each_component_builds_starts_and_stops_alone(tmp_path: Path, build: Builder) -> None:
    node = _node(tmp_path)
    component = build(node)
    assert component is not None, "every component is on a default node"
    assert component.name
    assert all(c.name for c in component.collectors())
    assert all(s.full_name for s in component.services())
    asyncio.run(_start_and_stop((component,)))


def test_the_list_builds_in_order_and_serves_every_component(tmp_path: Path) -> None:
    node = _node(tmp_path)
    components = build_components(node)
    names = [c.name for c in components]
    assert len(set(names)) == len(names) == len(COMPONENTS)
    assert names[0] == "simulation" and names[-1] == "grpc"  # the simulated files first, the sockets last
    metrics = node.built(MetricsEndpoint)
    rpc = node.built(RpcEndpoints)
    assert metrics is not None and rpc is not None
    served = {s.full_name for c in components for s in c.services() if not s.admin}
    assert {"xpu.runtime.v1.Health", "xpu.runtime.v1.Partitions", "xpu.runtime.v1.Topology"} <= served

    def listed() -> set[str]:
        """The services the main socket's reflection lists."""
        with grpc.insecure_channel(f"unix:{tmp_path}/run/healthd.sock") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[no-untyped-call]
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
            return {s.name for s in reply.list_services_response.service}

    async def run() -> set[str]:
        for component in components:
            await asyncio.wait_for(component.start(), 30)
        try:
            return await asyncio.to_thread(listed)
        finally:
            for component in reversed(components):
                await asyncio.wait_for(component.stop(), 10)

    assert served <= asyncio.run(run())


def test_questions_have_neutral_answers_until_someone_answers(tmp_path: Path) -> None:
    node = _node(tmp_path)
    assert node.pod_exists("default", "p") is None
    assert node.device_holders() is None
    assert node.first_card([0]) is None
    assert node.out_of_service() == frozenset()
    assert node.active_faults() == () and node.check_states() == ()
    assert node.attribution() is None
    build_components(node)
    assert node.pod_exists("default", "p") is None  # kubelet not read yet: still not known, never a guess
    with pytest.raises(RuntimeError, match="answered twice"):
        node.answer(placement=node)
    _close(node)


def test_partitions_off_leaves_them_out(tmp_path: Path) -> None:
    from healthd.daemon.config import Config
    from healthd.partition.settings import PartitionSettings

    config = Config(partitions=PartitionSettings(enabled=False))
    node = node_on(SimulatedBackend.from_name("h200x1"), tmp_path / "state", config, runtime_dir=tmp_path / "run")
    components = build_components(node)
    assert "partitions" not in [c.name for c in components]
    assert node.built(PartitionsComponent) is None
    _close(node)


def test_the_daemon_is_the_list(tmp_path: Path) -> None:
    from healthd.daemon.config import parse_config

    config = parse_config(
        {
            "daemon": {
                "simulate": "h200x1",
                "state_dir": str(tmp_path / "state"),
                "metrics_listen": "127.0.0.1:0",
                "grpc_listen": [f"unix:{tmp_path}/healthd.sock"],
            }
        }
    )
    daemon = Daemon(config, allow_fallback=False)
    assert [type(c).__module__ for c in daemon.components] == [b.__module__ for b in COMPONENTS]
    _close(daemon.node)


def test_the_cycle_gives_way_to_the_requests_the_metrics_server_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One count of requests in flight for the node: the metrics server counts into it, and a card's lane, the
    probes and attribution wait on it (tests/exporter/test_background_gives_way.py has each one's rules)."""
    monkeypatch.setattr(inflight, "BACKGROUND_WAIT_SECONDS", 3600.0)
    node = _node(tmp_path)
    build_components(node)
    try:
        metrics = node.built(MetricsEndpoint)
        health = node.built(HealthComponent)
        attribution = node.built(AttributionComponent)
        assert metrics is not None and health is not None and health.probes is not None and attribution is not None
        assert metrics.http.requests is node.requests
        probes, attributor = health.probes, attribution.attributor
        snapshot = node.sampler.run_once()
        done: list[str] = []
        node.requests.begin()
        work = [
            threading.Thread(
                target=lambda: done.append(str(node.device.access.submit(0, "x", lambda: 1, 60).result()))
            ),
            threading.Thread(target=lambda: done.append(str(len(probes.on_snapshot(snapshot)) > 0))),
            threading.Thread(target=lambda: done.append(str(attributor.update(snapshot).seq))),
        ]
        for thread in work:
            thread.start()
        for thread in work:
            thread.join(0.5)
        held = list(done)
        node.requests.end()
        for thread in work:
            thread.join(30)
        assert held == [], "nothing ran while the request was in flight"
        assert sorted(done) == sorted(["1", "True", str(snapshot.seq)])
    finally:
        _close(node)
        node.device.access.shutdown(1.0)
