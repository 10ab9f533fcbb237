"""The plugin against kubelet's device-manager rules (tests/support/kubelet_devicemanager.py) and the real daemon on
the simulated node: kubelet dropping its stream, kubelet.sock going away, a frozen daemon, a runtime without CDI,
the same slot allocated several times at once, and malformed kubelet calls."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from tests.kubernetes.stack import GPU, scenario_without_mig, stack
from tests.kubernetes.test_slices_e2e import partitions
from tests.support.clock import FakeClock
from tests.support.kubelet_devicemanager import ENDPOINT_STOP_GRACE_PERIOD
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

TDM = "xpu-runtime-kit.io/tdm-25c.32gib"
SHAPES = '[tdm]\nshapes = [{compute_percent = 25, memory = "32GiB"}]\n'
T = TypeVar("T")


def bounded(call: Callable[[], T], limit: float = 90.0) -> T:
    """Kubelet calls Allocate with no deadline; the test still must not hang forever if the plugin does."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=limit)


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        bounded(call)
    return err.value


def logged(plugin: Any, event: str) -> bool:
    return any(e.get("event") == event for e in plugin.events())


@pytest.mark.timeout(240)
def test_stream_drop_and_a_missing_kubelet_socket(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    config = "[kubelet]\nstream_grace_seconds = 2\n"
    scenario = str(scenario_without_mig(tmp_path))
    with stack(tmp_path, scenario=scenario, plugin_config=config, kubelet_clock=clock) as (_, kubelet, plugin):
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy cards")
        request = kubelet.plugin(GPU).request
        assert request.endpoint == "xpu-runtime-kit.io_gpu.sock"  # one prefix, from the resource name

        # CDI answer: the card by name, and a legacy runtime told to add nothing (not the cards a second time)
        (uuid,), response = kubelet.admit("team", "a", "main", GPU, 1)
        assert [c.name for c in response.cdi_devices] == [f"{GPU}={uuid}"]
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert response.envs["CUDA_VISIBLE_DEVICES"] == uuid

        # kubelet disconnects the plugin's client while kubelet.sock stays (runClient after a late stream end)
        connects = kubelet.events().count(("connected", GPU))
        kubelet.drop_stream(GPU)
        assert kubelet.healthy(GPU) == []  # PluginDisconnected: every device unhealthy at once
        capacity, allocatable, _ = kubelet.capacity()
        assert (capacity[GPU], allocatable[GPU]) == (8, 0)
        kubelet.wait(lambda: kubelet.events().count(("connected", GPU)) > connects, "the plugin registers again")
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy on the new stream")
        assert logged(plugin, "kubelet has no ListAndWatch stream open; registering again")
        clock.advance(ENDPOINT_STOP_GRACE_PERIOD + 1)  # the old endpoint's grace would have run out by now
        capacity, allocatable, deleted = kubelet.capacity()
        assert (capacity[GPU], allocatable[GPU], deleted) == (8, 8, [])

        # kubelet's own race: the plugin's socket goes, the plugin serves and registers again, and the old
        # stream's end is processed only then, so runClient disconnects the *new* client
        gate = threading.Event()
        kubelet.manager.stream_end_gate = gate
        connects = kubelet.events().count(("connected", GPU))
        (kubelet.dir / request.endpoint).unlink()
        kubelet.wait(lambda: kubelet.events().count(("connected", GPU)) > connects, "registered on a new socket")
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy on the new client")
        kubelet.manager.stream_end_gate = None
        disconnects = kubelet.events().count(("disconnected", GPU))
        gate.set()
        # counted, not the last event: the new client's own "stream ended" and the plugin's next "connected" can
        # follow the disconnect before this thread looks
        kubelet.wait(
            lambda: kubelet.events().count(("disconnected", GPU)) > disconnects, "the late stream end disconnects it"
        )
        kubelet.wait(
            lambda: kubelet.events().count(("connected", GPU)) > connects + 1, "and the plugin registers again"
        )
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy after the race")

        # kubelet goes away and its socket with it: the plugin says so, and registers when kubelet is back
        kubelet.stop()
        (kubelet.dir / "kubelet.sock").unlink(missing_ok=True)
        wait_until(
            lambda: logged(
                plugin, "no kubelet.sock in the kubelet directory; waiting for kubelet (is --kubelet-dir right?)"
            ),
            "the plugin reports the missing kubelet.sock",
        )
        registrations = len(kubelet.registrations)
        kubelet.start()
        kubelet.wait(lambda: len(kubelet.registrations) > registrations, "registration once kubelet is back")
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy after kubelet came back")
        assert plugin.proc is not None and plugin.proc.poll() is None


@pytest.mark.timeout(180)
def test_the_plugin_serves_before_the_daemon_answers_and_cards_join_when_it_does(tmp_path: Path) -> None:
    scenario = str(scenario_without_mig(tmp_path))
    with stack(tmp_path, scenario=scenario, start_daemon=False) as (daemon, kubelet, plugin):
        # no daemon yet: the resource is registered anyway, with nothing in it (not withheld until every card is read)
        kubelet.wait(lambda: GPU in kubelet.plugins, "the gpu resource registered without a daemon")
        assert kubelet.devices(GPU) == []
        daemon.start()
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "the cards join once the daemon answers")
        assert logged(plugin, "daemon reachable")


@pytest.mark.timeout(240)
def test_a_frozen_daemon_turns_every_device_unhealthy_until_it_answers(tmp_path: Path) -> None:
    config = "[daemon]\ngrace_seconds = 6\n" + SHAPES
    with stack(tmp_path, scenario=str(scenario_without_mig(tmp_path)), plugin_config=config) as (
        daemon,
        kubelet,
        plugin,
    ):
        assert daemon.xpuctl("partitions", "mode", "3", "tdm").returncode == 0
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 7 and len(kubelet.healthy(TDM)) == 4, "7 cards, 4 slots")
        slot = kubelet.healthy(TDM)[0]
        card = kubelet.healthy(GPU)[0]
        assert daemon.proc is not None
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            # within the grace period a slice Allocate fails at its first read of the daemon, with a reason
            probe = rpc_error(lambda: kubelet.allocate(TDM, [slot]))
            assert probe.code() == grpc.StatusCode.UNAVAILABLE
            assert "xpu-healthd did not answer within 3 s" in probe.details()

            kubelet.wait(
                lambda: kubelet.healthy(GPU) == [] and kubelet.healthy(TDM) == [],
                "every device Unhealthy while the daemon is frozen",
                timeout=60,
            )
            assert len(kubelet.devices(GPU)) == 7  # still listed: kubelet keeps the capacity, not the allocatable
            refused = rpc_error(lambda: kubelet.allocate(GPU, [card]))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
            assert "xpu-healthd has not answered for" in refused.details()
            assert "no card on this node is monitored" in refused.details()
            assert logged(plugin, "every device Unhealthy: the daemon does not answer")
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 7, "healthy again once the daemon answers", timeout=60)
        kubelet.wait(lambda: len(kubelet.healthy(TDM)) == 4, "slots healthy again")
        assert logged(plugin, "the daemon answers again; devices follow its health")
        _, response = kubelet.admit("team", "after", "main", TDM, 1)
        assert response.envs["XPU_PARTITION_ID"].startswith("p-")


def spec_of(daemon: Any) -> dict[str, Any]:
    (path,) = (daemon.tmp / "state" / "cdi").glob("*.json")
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def spec_nodes(spec: dict[str, Any], name: str) -> list[str]:
    device = next(d for d in spec["devices"] if d["name"] == name)
    edits = [spec.get("containerEdits", {}), device["containerEdits"]]
    return [n["path"] for e in edits for n in e.get("deviceNodes", [])]


@pytest.mark.timeout(240)
def test_device_nodes_for_a_runtime_without_cdi_and_one_partition_per_slot(tmp_path: Path) -> None:
    config = f'[runtime]\nanswer = "device-nodes"\ncdi_spec_dir = "{tmp_path / "state" / "cdi"}"\n' + SHAPES
    with stack(tmp_path, scenario=str(scenario_without_mig(tmp_path)), plugin_config=config) as (
        daemon,
        kubelet,
        plugin,
    ):
        assert daemon.xpuctl("partitions", "mode", "3", "tdm").returncode == 0
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 7 and len(kubelet.healthy(TDM)) == 4, "7 cards, 4 slots")

        # a whole card: its nodes as kubelet DeviceSpecs, no CDI names (a runtime without CDI ignores them)
        (uuid,), response = kubelet.admit("team", "whole", "main", GPU, 1)
        assert list(response.cdi_devices) == []
        nodes = [d.container_path for d in response.devices]
        assert nodes == spec_nodes(spec_of(daemon), uuid) and any(n.startswith("/dev/nvidia") for n in nodes)
        assert "/dev/nvidiactl" in nodes
        assert all(d.host_path and d.permissions for d in response.devices)
        assert (response.envs["CUDA_VISIBLE_DEVICES"], response.envs["NVIDIA_VISIBLE_DEVICES"]) == (uuid, "void")

        # a TDM slot Allocated four times at once (a retried or duplicated call): one partition, the same answer
        slot = kubelet.healthy(TDM)[0]
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda _: kubelet.allocate(TDM, [slot]), range(4)))
        ids = {a.envs["XPU_PARTITION_ID"] for a in answers}
        assert len(ids) == 1
        made = [p for p in partitions(daemon.address) if p.owner.lease.kubelet_device.device_id == slot]
        assert [p.id for p in made] == list(ids)
        again = bounded(lambda: kubelet.allocate(TDM, [slot]))
        assert again.envs["XPU_PARTITION_ID"] in ids
        (renewed,) = [p for p in partitions(daemon.address) if p.id in ids]
        assert renewed.lease_expires_at > made[0].lease_expires_at  # the repeat gives its pod a full lease
        tdm = answers[0]
        assert tdm.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert tdm.envs["NVIDIA_VISIBLE_DEVICES"] == "void" and list(tdm.cdi_devices) == []
        cdi_name = made[0].cdi_device.split("=", 1)[1]
        assert [d.container_path for d in tdm.devices] == spec_nodes(spec_of(daemon), cdi_name)
        pipe = tdm.envs["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe in {m.container_path for m in tdm.mounts}

        # malformed calls get a clear refusal, never a partition under an id kubelet did not list
        uuid3 = slot.split("::")[0]
        for bad in (f"{uuid3}::01", f"{uuid3}::\u0663", f"{uuid3}::\u00b2", f"{uuid3}::" + "9" * 5000):
            error = rpc_error(lambda bad=bad: kubelet.allocate(TDM, [bad]))  # type: ignore[misc]
            assert error.code() == grpc.StatusCode.NOT_FOUND, bad[:60]
        twice = rpc_error(lambda: kubelet.allocate(GPU, [uuid, uuid]))
        assert twice.code() == grpc.StatusCode.INVALID_ARGUMENT and "twice" in twice.details()
        negative = rpc_error(lambda: kubelet.preferred(GPU, kubelet.healthy(GPU), -1))
        assert negative.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len([p for p in partitions(daemon.address) if p.gpu == 3]) == 1
        assert plugin.proc is not None and plugin.proc.poll() is None
