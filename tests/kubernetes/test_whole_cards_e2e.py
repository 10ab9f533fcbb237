"""Whole cards end to end: a simulated 8-card daemon, the plugin as a process, a kubelet double on the real protos.

Registration, the ListAndWatch stream, a health flip on an injected fatal XID and back after the operator resolves
it, GetPreferredAllocation equal to the daemon's choice, Allocate returning CDI names from the daemon's spec, and
restarts of the plugin, the daemon and kubelet.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import topology_pb2 as tpb
from healthd.api.v1 import topology_pb2_grpc as tpb_grpc
from tests.kubernetes.stack import GPU, cdi_names, scenario_without_mig, stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_whole_cards_against_a_kubelet_double(tmp_path: Path) -> None:
    with stack(tmp_path, scenario=str(scenario_without_mig(tmp_path))) as (daemon, kubelet, plugin):
        # registration names the resource; the stream lists every card, healthy, with its NUMA node
        kubelet.wait(lambda: len(kubelet.healthy(GPU)) == 8, "8 healthy cards listed")
        request = next(r for r in kubelet.registrations if r.resource_name == GPU)
        assert request.version == "v1beta1"
        assert (kubelet.dir / request.endpoint).exists()
        assert kubelet.plugin(GPU).options.get_preferred_allocation_available
        devices = kubelet.devices(GPU)
        uuids = [d.ID for d in devices]
        assert all(u.startswith("GPU-") for u in uuids)
        assert {d.topology.nodes[0].ID for d in devices} == {0, 1}

        # GetPreferredAllocation for 4 of 8: the daemon's own best-connected set, all healthy, one NUMA/PCIe group
        chosen = kubelet.preferred(GPU, uuids, 4)
        with grpc.insecure_channel(daemon.address) as channel:
            topology = tpb_grpc.TopologyStub(channel)
            daemon_choice = topology.PreferredAllocation(tpb.PreferredAllocationRequest(count=4, available=uuids))
            graph = topology.Get(tpb.GetTopologyRequest())
        assert chosen == list(daemon_choice.uuids)
        numa = {g.uuid: g.location.numa_node for g in graph.gpus}
        assert len({numa[u] for u in chosen}) == 1
        assert daemon_choice.worst_link.startswith("NV")

        # Allocate: CDI names that exist in the daemon's spec, the env a CUDA container needs, the nearest NICs
        response = kubelet.allocate(GPU, chosen[:2])
        names = [c.name for c in response.cdi_devices]
        assert names == [f"{GPU}={u}" for u in chosen[:2]]
        assert set(names) <= cdi_names(daemon)
        assert response.envs["CUDA_VISIBLE_DEVICES"] == ",".join(chosen[:2])
        assert response.annotations["xpu-runtime-kit.io/rdma-nics"] == response.envs["XPU_RDMA_NICS"]
        assert re.fullmatch(r"mlx5_\d+(,mlx5_\d+)*", response.envs["XPU_RDMA_NICS"])
        with pytest.raises(grpc.RpcError) as unknown:
            kubelet.allocate(GPU, ["GPU-00000000-0000-0000-0000-000000000000"])
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        # a fatal XID on GPU 2 flips its device to Unhealthy; the operator's resolve flips it back
        gpu2 = uuids[2]
        injected = daemon.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=79")
        assert injected.returncode == 0, injected.stderr
        kubelet.wait(lambda: kubelet.health(GPU)[gpu2] == "Unhealthy", "GPU 2 Unhealthy")
        assert sorted(kubelet.healthy(GPU)) == sorted(u for u in uuids if u != gpu2)
        assert gpu2 not in kubelet.preferred(GPU, uuids, 7)  # the daemon leaves it out too
        listed = daemon.xpuctl("faults", "list", "--state", "active", "--gpu", "2")
        fault_id = listed.stdout.splitlines()[-1].split()[0]  # below the header
        assert fault_id.startswith("flt-"), listed.stdout
        denied = daemon.xpuctl("faults", "resolve", fault_id, "--reason", "x", "--admin-socket", daemon.address)
        assert denied.returncode != 0 and "PERMISSION_DENIED" in denied.stderr
        resolved = daemon.xpuctl("faults", "resolve", fault_id, "--reason", "GPU 2 reseated, ticket 7")
        assert resolved.returncode == 0, resolved.stderr
        assert "resolved" in resolved.stdout and "operator: GPU 2 reseated, ticket 7" in resolved.stdout
        kubelet.wait(lambda: kubelet.health(GPU)[gpu2] == "Healthy", "GPU 2 Healthy again")

        # the plugin restarts: it registers again and lists the same cards
        registrations = len(kubelet.registrations)
        plugin.stop()
        # kubelet marks the stopped plugin's cards unhealthy first: "8 healthy" below is then the new stream's list
        kubelet.wait(lambda: kubelet.healthy(GPU) == [], "the stopped plugin's cards unhealthy")
        plugin.start()
        kubelet.wait(lambda: len(kubelet.registrations) > registrations, "the restarted plugin registers")
        kubelet.wait(lambda: sorted(kubelet.healthy(GPU)) == sorted(uuids), "8 healthy after the plugin restart")

        # the daemon restarts: the plugin's fault stream resumes, and a fault after the restart still flips health
        daemon.stop()
        daemon.start()
        assert daemon.xpuctl("simulate", "inject", "xid", "--gpu", "5", "code=79").returncode == 0
        kubelet.wait(lambda: kubelet.health(GPU)[uuids[5]] == "Unhealthy", "GPU 5 Unhealthy after a daemon restart")
        assert kubelet.health(GPU)[gpu2] == "Healthy"

        # kubelet restarts and empties the directory: the plugin serves again and registers again
        registrations = len(kubelet.registrations)
        kubelet.restart()
        kubelet.wait(lambda: len(kubelet.registrations) > registrations, "re-registration after a kubelet restart")
        kubelet.wait(lambda: len(kubelet.devices(GPU)) == 8, "the new stream lists the cards")
        assert kubelet.health(GPU)[uuids[5]] == "Unhealthy"
        wait_until(
            lambda: any(
                e.get("event") == "kubelet restarted or our socket is gone; serving again" for e in plugin.events()
            ),
            "plugin noticed",
        )
