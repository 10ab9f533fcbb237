"""The built-in busy node (``--simulate h200x8-busy``): 8 H200 cards, 400 GPU processes in 100 pods, served through the
simulated kubelet, so the headline /metrics figures are one command anyone can reproduce."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.scenarios import busy_toml
from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from healthd.sim.node import allocations_of
from tests.support.daemon_process import DaemonProcess


def test_the_packaged_file_is_what_the_generator_writes() -> None:
    text = resources.files("exporter.scenarios").joinpath("h200x8-busy.toml").read_text()
    assert text == busy_toml(), "run: python3 -m bench.scenarios --write-busy"


def test_it_is_h200x8_with_400_processes_in_100_pods() -> None:
    busy, base = load_scenario("h200x8-busy"), load_scenario("h200x8")
    assert busy.cards == base.cards and busy.mig_instances == base.mig_instances
    assert busy.extra["topology"] == base.extra["topology"]
    assert len(busy.processes) == 400 and len({p.pid for p in busy.processes}) == 400
    pods = {(p.namespace, p.pod) for p in busy.processes}
    assert len(pods) == 100
    places = defaultdict(set)
    for p in busy.processes:
        places[(p.namespace, p.pod)].add((p.gpu, p.gpu_instance_id))
    assert all(len(where) == 1 for where in places.values()), "a pod's processes share one card or MIG instance"
    assert 6 not in {p.gpu for p in busy.processes}, "GPU 6 is MIG-enabled with no instance: nothing can run there"
    assert {p.gpu_instance_id for p in busy.processes if p.gpu == 7} == {1, 2}
    assert all(p.gpu_instance_id is None for p in busy.processes if p.gpu != 7)


def test_it_fits_the_cards_and_shares_them_between_pods() -> None:
    backend = SimulatedBackend.from_name("h200x8-busy")
    backend.open()
    for i in range(8):
        assert backend.sample(i).memory_free_bytes > 0
    for inst in backend.mig_instances(7):
        assert isinstance(inst.memory_used_bytes, int) and 0 < inst.memory_used_bytes <= inst.memory_total_bytes
    load = Counter[tuple[int, int | None]]()
    for p in backend.scenario.processes:
        load[(p.gpu, p.gpu_instance_id)] += p.load
    assert max(load.values()) <= 1.0
    allocations = allocations_of(backend.workloads())
    assert len(allocations) == 400  # one replica per container, 4 containers per pod
    assert all("::" in a.device_id for a in allocations), "every card and MIG instance is shared by several pods"


@pytest.mark.e2e
def test_the_daemon_runs_it_with_the_simulated_kubelet(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path, scenario="h200x8-busy", interval=2.0, deadline=1.0) as d:
        deadline = time.monotonic() + 60
        while True:
            families = {f.name: f for f in text_string_to_metric_families(d.metrics())}
            processes = families.get("xpu_pod_gpu_processes")
            if processes is not None and sum(s.value for s in processes.samples) == 400:
                break
            assert time.monotonic() < deadline, "pods not attributed within 60 s"
            time.sleep(0.5)
        assert len({(s.labels["namespace"], s.labels["pod"]) for s in processes.samples}) == 100
        allocated = families["xpu_pod_gpu_allocated"].samples
        assert len(allocated) == 400
        folded = {s.labels["gpu"]: s.value for s in families["xpu_process_folded"].samples}
        assert folded["7"] == 96 - 64, "GPU 7 runs 96 processes; the default keeps 64 series per card"
        assert families["xpu_kubelet_pod_resources_up"].samples[0].value == 1.0
