"""The daemon on the simulated h200x8 node serves Topology over its real socket and exports xpu_topology_*."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import grpc

from exporter.sampler import SamplerSettings
from exporter.topology.settings import TopologySettings
from healthd.api.v1 import topology_pb2 as pb
from healthd.api.v1 import topology_pb2_grpc as pb_grpc
from healthd.daemon.config import Config, with_overrides
from healthd.daemon.daemon import Daemon


def test_daemon_serves_topology(tmp_path: Path) -> None:
    features = tmp_path / "features.d"
    features.mkdir()
    config = with_overrides(
        Config(
            sampler=SamplerSettings(interval_seconds=0.5, call_deadline_seconds=2.0),
            topology=TopologySettings(nfd_feature_file=str(features / "xpu-runtime-kit"), network=(("block", "b1"),)),
        ),
        metrics_listen="127.0.0.1:0",
        grpc_listen=(f"unix:{tmp_path}/healthd.sock",),
        state_dir=tmp_path / "state",
        simulate="h200x8",
    )

    async def scenario() -> tuple[list[int], str, str]:
        daemon = Daemon(config, allow_fallback=False)
        await daemon.start()
        try:
            address = f"unix:{tmp_path}/healthd.sock"

            def call() -> list[int]:
                with grpc.insecure_channel(address) as channel:
                    stub = pb_grpc.TopologyStub(channel)  # type: ignore[no-untyped-call]
                    give_up = time.monotonic() + 30
                    while True:  # the first collection runs just after start
                        try:
                            reply = stub.PreferredAllocation(pb.PreferredAllocationRequest(count=4), timeout=10)
                            return list(reply.gpus)
                        except grpc.RpcError as exc:
                            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:  # type: ignore[attr-defined]
                                raise
                            time.sleep(0.1)

            gpus = await asyncio.to_thread(call)
            url = f"http://127.0.0.1:{daemon.metrics.http.port}/metrics"

            def scrape() -> str:  # /metrics shows the topology from the next render after it was collected
                give_up = time.monotonic() + 30
                while "xpu_topology_up 1.0" not in (text := urllib.request.urlopen(url, timeout=10).read().decode()):
                    if time.monotonic() > give_up:
                        return text
                    time.sleep(0.1)
                return text

            metrics = await asyncio.to_thread(scrape)
            return gpus, metrics, (features / "xpu-runtime-kit").read_text()
        finally:
            await daemon.stop()

    gpus, metrics, feature_file = asyncio.run(scenario())
    assert gpus == [0, 1, 2, 3]
    assert "xpu_topology_up 1.0" in metrics
    assert 'xpu_topology_gpu_nvlinks{gpu="3",peer="4"} 18.0' in metrics
    assert "xpu.feature.node.kubernetes.io/network.block=b1" in feature_file.splitlines()
    assert (tmp_path / "state" / "simulated-sysfs" / "class" / "infiniband" / "mlx5_7").is_symlink()


def test_simulated_node_without_layout_never_reads_host_sysfs(tmp_path: Path) -> None:
    from exporter.backends.simulated import SimulatedBackend
    from healthd.sim import component as simulation
    from healthd.topology import component as topology
    from tests.support.node import node_on

    node = node_on(SimulatedBackend.from_name("h200x1"), tmp_path / "state")  # the host view, as the daemon has it
    machine = simulation.build(node).machine
    assert machine is not None
    machine.start()  # the simulated node's files, as its component writes them first
    node.sampler.run_once()
    part = topology.build(node)
    assert part.refresher is not None
    t = part.refresher.refresh()
    assert t is not None
    assert t.source == str(tmp_path / "state" / "simulated-sysfs")
    assert t.nics == ()
    assert t.gpus[0].location.numa_node is None
    assert "GPU 0: PCI device" in t.warnings[0]
    machine.stop()
    node.sampler.stop()
    node.device.access.shutdown(1.0)
