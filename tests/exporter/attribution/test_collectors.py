"""Attribution end to end without the daemon: simulated GPUs, fixture proc trees, kubelet log directories, a real
pod-resources gRPC server, rendered through prometheus_client and parsed back."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import DeviceAllocation, KubeletPodResources
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.sim.node import SimulatedNode, container_id, pod_uid

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Series:
    out: Series = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def pick(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    want = set(labels.items())
    return {k: v for (n, k), v in series.items() if n == name and want <= k}


def one(series: Series, name: str, **labels: str) -> float:
    found = pick(series, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


class Node:
    """Simulated GPUs + the simulated node files + the real readers, sampled on demand."""

    def __init__(self, root: Path, *, max_per_gpu: int = 64) -> None:
        self.backend = SimulatedBackend.from_name("h200x8")
        self.sim = SimulatedNode(self.backend, root / "node")
        self.sim.kubelet.socket_path = Path("/tmp") / f"xpu-ac-{abs(hash(root)) % 10**8}.sock"
        self.sampler = Sampler(self.backend, SamplerSettings(interval_seconds=60, call_deadline_seconds=5))
        self.kubelet = KubeletPodResources(self.sim.kubelet.socket_path, refresh_interval=60)
        self.attributor = Attributor(
            ProcResolver(self.sim.proc_root), pod_index=PodLogIndex(self.sim.log_root), kubelet=self.kubelet
        )
        self.sampler.subscribe(self.attributor.update)  # the simulated node follows the backend by itself
        self.registry = CollectorRegistry(auto_describe=False)
        collectors = [
            ProcessCollector(self.attributor.latest, max_per_gpu=max_per_gpu),
            PodCollector(self.attributor.latest),
        ]
        self.registry.register(SnapshotExporter(self.sampler.latest, collectors))

    def uuid(self, gpu: int) -> str:
        """Process and pod series name their card by uuid only (its index is on xpu_gpu_info)."""
        return self.backend.scenario.cards[gpu].uuid

    def cycle(self) -> Series:
        self.sampler.run_once()  # the kubelet server answers with the new pods
        assert self.sampler.wait_subscribers()
        self.kubelet.refresh()
        self.sampler.run_once()  # attribution with the fresh allocations
        assert self.sampler.wait_subscribers()
        return scrape(self.registry)

    def close(self) -> None:
        self.kubelet.stop()
        self.sim.stop()
        self.sampler.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    n.sim.start()
    yield n
    n.close()


def test_process_and_pod_series_match_the_simulated_pods(node: Node) -> None:
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="41001", pod="llama-train-0", namespace="ml-train") == (
        118784 * 2**20
    )
    # the shared card: each pod gets only its own process's numbers
    triton = one(s, "xpu_pod_gpu_memory_used_bytes", pod="triton-0", uuid=node.uuid(4))
    vllm = one(s, "xpu_pod_gpu_memory_used_bytes", pod="vllm-chat-0", uuid=node.uuid(4))
    assert (triton, vllm) == (40960 * 2**20, 65536 * 2**20)
    assert one(s, "xpu_pod_sm_utilization_ratio", pod="triton-0") == one(
        s, "xpu_process_sm_utilization_ratio", pid="52010"
    )
    # allocations as kubelet reports them, with the shared replicas' ::N suffix, joinable by uuid
    allocated = pick(s, "xpu_pod_gpu_allocated", uuid=node.uuid(4))
    assert {dict(k)["device_id"].rsplit("::", 1)[1] for k in allocated} == {"0", "1"}
    uuid4 = node.backend.scenario.cards[4].uuid
    assert all(dict(k)["uuid"] == uuid4 for k in allocated)
    # MIG: the process on GPU instance 1 of GPU 7, allocated as its MIG device
    assert one(s, "xpu_pod_gpu_memory_used_bytes", pod="jupyter-alice", gpu_instance_id="1") == 9216 * 2**20
    mig = one(s, "xpu_pod_gpu_allocated", pod="jupyter-alice")
    assert mig == 1.0
    (labels,) = pick(s, "xpu_pod_gpu_allocated", pod="jupyter-alice")
    assert dict(labels)["device_id"].startswith("MIG-")
    assert dict(labels)["gpu_instance_id"] == "1"
    assert one(s, "xpu_kubelet_pod_resources_up") == 1.0
    assert one(s, "xpu_kubelet_allocatable_devices", resource="nvidia.com/gpu") == 8.0


def test_series_name_their_card_by_uuid_only_and_leave_empty_optional_labels_out(node: Node) -> None:
    s = node.cycle()
    for name in ("xpu_process_gpu_memory_used_bytes", "xpu_process_sm_utilization_ratio"):
        series = [dict(k) for k in pick(s, name)]
        assert len(series) == 8
        assert all("gpu" not in labels and labels["uuid"].startswith("GPU-") for labels in series)
        assert all({"pid", "process", "namespace", "pod", "container"} <= set(labels) for labels in series)
        assert [labels["gpu_instance_id"] for labels in series if "gpu_instance_id" in labels] == ["1"]
        assert not [labels for labels in series if "slurm_job" in labels]
    for name in ("xpu_pod_gpu_memory_used_bytes", "xpu_pod_gpu_processes", "xpu_pod_gpu_allocated"):
        series = [dict(k) for k in pick(s, name)]
        assert series and all("gpu" not in labels for labels in series)
        assert sorted(labels["pod"] for labels in series if "gpu_instance_id" in labels) == ["jupyter-alice"]


def test_injected_process_gets_its_pod_and_vanishes_when_it_exits(node: Node) -> None:
    node.backend.inject(
        "process_start",
        5,
        {"pid": "70001", "name": "trainer", "pod": "ft-job-0", "namespace": "team-a", "container": "w"},
    )
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="70001", pod="ft-job-0", namespace="team-a", container="w")
    # GPU 5 is now shared: both pods hold a replica, each sees only its own process
    assert one(s, "xpu_pod_gpu_memory_used_bytes", pod="ft-job-0") == 1024 * 2**20
    assert one(s, "xpu_pod_gpu_memory_used_bytes", pod="vllm-code-0") == 98304 * 2**20
    assert len(pick(s, "xpu_pod_gpu_allocated", uuid=node.uuid(5))) == 2
    node.backend.inject("process_exit", 5, {"pid": "70001"})
    s = node.cycle()
    assert pick(s, "xpu_process_gpu_memory_used_bytes", pid="70001") == {}
    assert pick(s, "xpu_pod_gpu_memory_used_bytes", pod="ft-job-0") == {}
    assert pick(s, "xpu_pod_gpu_allocated", pod="ft-job-0") == {}
    assert not (node.sim.proc_root / "70001").exists()


def test_shared_card_without_log_index_is_left_unknown_not_guessed(node: Node, tmp_path: Path) -> None:
    node.attributor.pod_index = PodLogIndex(tmp_path / "no-logs")  # e.g. /var/log not mounted
    s = node.cycle()
    # GPU 4 is shared by two pods: the kubelet answer cannot tell which process is whose
    for pid in ("52010", "52011"):
        assert one(s, "xpu_process_gpu_memory_used_bytes", pid=pid, pod="", namespace="") > 0
    assert pick(s, "xpu_pod_gpu_memory_used_bytes", uuid=node.uuid(4)) == {}
    # an exclusively held card still maps through kubelet's allocation
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="52020", pod="vllm-code-0", container="vllm") > 0


def test_mps_server_is_never_attributed_to_a_pod(node: Node) -> None:
    # under MPS NVML lists only the server; it runs in the device plugin's MPS pod, but serves every client
    node.backend.inject(
        "process_start",
        6,
        {"pid": "80000", "name": "nvidia-cuda-mps-server", "pod": "mps-control", "namespace": "gpu-operator"},
    )
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="80000", process="nvidia-cuda-mps-server", pod="") > 0
    assert pick(s, "xpu_pod_gpu_memory_used_bytes", pod="mps-control") == {}
    assert pick(s, "xpu_pod_gpu_memory_used_bytes", uuid=node.uuid(6)) == {}


def test_process_cap_folds_the_rest_and_pod_sums_stay_whole(tmp_path: Path) -> None:
    n = Node(tmp_path, max_per_gpu=2)
    n.sim.start()
    try:
        for i in range(5):
            n.backend.inject(
                "process_start",
                6,
                {"pid": str(90000 + i), "memory_mib": str(100 * (i + 1)), "pod": "many", "namespace": "x"},
            )
        s = n.cycle()
        kept = pick(s, "xpu_process_gpu_memory_used_bytes", uuid=n.uuid(6))
        assert len(kept) == 3  # two biggest + the "other" series
        assert {dict(k)["pid"] for k in kept} == {"90004", "90003", ""}
        other = one(s, "xpu_process_gpu_memory_used_bytes", uuid=n.uuid(6), process="other")
        assert other == (100 + 200 + 300) * 2**20
        assert one(s, "xpu_process_folded", gpu="6", uuid=n.uuid(6)) == 3
        assert one(s, "xpu_pod_gpu_memory_used_bytes", pod="many") == 1500 * 2**20
        assert one(s, "xpu_pod_gpu_processes", pod="many") == 5
    finally:
        n.close()


def test_slurm_docker_and_host_processes(node: Node) -> None:
    node.backend.inject("process_start", 6, {"pid": "91000", "name": "slurm-task"})
    node.backend.inject("process_start", 6, {"pid": "91001", "name": "docker-task"})
    node.backend.inject("process_start", 6, {"pid": "91002", "name": "host-task"})
    node.cycle()
    cid = "ab" * 32
    (node.sim.proc_root / "91000" / "cgroup").write_text(
        "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
    )
    (node.sim.proc_root / "91001" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
    (node.sim.proc_root / "91002" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    for pid in ("91000", "91001", "91002"):  # new start time: as if these were the processes now
        stat = node.sim.proc_root / pid / "stat"
        fields = stat.read_text().split()
        fields[21] = str(int(fields[21]) + 1)
        stat.write_text(" ".join(fields) + "\n")
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="91000", slurm_job="4242", pod="") > 0
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="91001", container=cid[:12], pod="") > 0
    (host,) = pick(s, "xpu_process_gpu_memory_used_bytes", pid="91002", container="", pod="", namespace="")
    assert "slurm_job" not in dict(host), "an empty label is left out (Prometheus reads it as absent anyway)"


def test_process_name_from_comm_when_backend_gives_none(node: Node) -> None:
    s0 = node.cycle()
    assert one(s0, "xpu_process_gpu_memory_used_bytes", pid="41001", process="python3")
    # what NVML does: no names. The resolver reads /proc/<pid>/comm
    snap = node.sampler.latest()
    assert isinstance(snap, Snapshot)
    nameless = dataclasses.replace(
        snap,
        gpus=tuple(
            dataclasses.replace(g, processes=tuple(dataclasses.replace(p, name="") for p in g.processes))
            for g in snap.gpus
        ),
    )
    result = node.attributor.update(nameless)
    names = {p.pid: p.name for p in result.processes}
    assert names[41001] == "python3"
    assert names[52010] == "tritonserver"


def test_log_index_names_and_uids_are_consistent(node: Node) -> None:
    node.cycle()
    index = PodLogIndex(node.sim.log_root)
    index.refresh()
    ref = index.container(container_id("inference", "triton-0", "triton"))
    assert ref is not None
    assert (ref.namespace, ref.pod, ref.container) == ("inference", "triton-0", "triton")
    pod = index.pod(pod_uid("ml-train", "llama-train-2"))
    assert pod is not None
    assert pod.containers == ("trainer",)


def test_kubelet_absent_means_no_kubelet_series(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_name("h200x1")
    sampler = Sampler(backend, SamplerSettings(interval_seconds=60))
    attributor = Attributor(
        ProcResolver(tmp_path / "proc"),
        pod_index=PodLogIndex(tmp_path / "log"),
        kubelet=KubeletPodResources(tmp_path / "missing.sock", refresh_interval=60),
    )
    assert attributor.kubelet is not None
    attributor.kubelet.refresh()
    attributor.update(sampler.run_once())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler.latest, [PodCollector(attributor.latest)]))
    s = scrape(registry)
    assert not [k for k in s if k[0].startswith("xpu_kubelet_")]
    assert one(s, "xpu_collector_success", collector="pod") == 1.0
    sampler.stop()


def test_allocation_for_a_device_of_another_node_counts_as_unmatched(node: Node) -> None:
    node.sim.kubelet._allocations = lambda: [  # type: ignore[method-assign]
        DeviceAllocation("a", "b", "c", "nvidia.com/gpu", "GPU-00000000-0000-0000-0000-000000000000"),
        DeviceAllocation("a", "b", "c", "nvidia.com/gpu", "nvidia3"),
    ]
    s = node.cycle()
    assert one(s, "xpu_kubelet_pod_resources_unmatched_devices") == 1.0
    assert one(s, "xpu_pod_gpu_allocated", device_id="nvidia3", uuid=node.uuid(3)) == 1.0


def test_a_cgroup_named_after_another_pods_container_keeps_its_own_pod(node: Node) -> None:
    """A tenant who can write its own cgroup makes a child named after another pod's container (that id is visible
    to anyone who can read pods). The pod UID of kubelet's slice above it decides: the process stays its pod's."""
    node.backend.inject(
        "process_start",
        5,
        {"pid": "70002", "name": "trainer", "pod": "ft-job-0", "namespace": "team-a", "container": "w"},
    )
    s = node.cycle()
    (victim,) = pick(s, "xpu_process_gpu_memory_used_bytes", pod="vllm-code-0")
    victim_cgroup = (node.sim.proc_root / dict(victim)["pid"] / "cgroup").read_text().strip()
    victim_id = victim_cgroup.rsplit("cri-containerd-", 1)[1].removesuffix(".scope")
    cgroup = node.sim.proc_root / "70002" / "cgroup"
    own = cgroup.read_text().strip()
    assert own.startswith("0::/kubepods") and victim_id not in own
    cgroup.write_text(f"{own}/cri-containerd-{victim_id}.scope\n")
    stat = node.sim.proc_root / "70002" / "stat"  # a new start time: the resolver reads the process again
    fields = stat.read_text().split()
    fields[21] = str(int(fields[21]) + 1)
    stat.write_text(" ".join(fields) + "\n")
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="70002", pod="ft-job-0", namespace="team-a", container="w")
    assert one(s, "xpu_pod_gpu_memory_used_bytes", pod="vllm-code-0") == 98304 * 2**20  # only its own process


def test_a_remembered_process_follows_its_cards_holders_and_the_log_index(node: Node) -> None:
    """The Attributor reuses a process's attribution while nothing it came from changed: a change in who holds
    the card, or a log index appearing, must still reach an unchanged process."""
    real = node.attributor.pod_index
    node.attributor.pod_index = None  # names from kubelet's allocations only
    for _ in range(2):  # the second cycle is the one that may reuse the first's answer
        s = node.cycle()
        assert one(s, "xpu_process_gpu_memory_used_bytes", pid="52010", pod="", namespace="") > 0
    # kubelet's answer changes while the process does not: one of GPU 4's two pods loses its allocation
    node.sim.kubelet._allocations = lambda: [a for a in node.sim.allocations() if "::1" not in a.device_id]
    s = node.cycle()
    holders = {a.pod for a in node.kubelet.view().allocations if a.device_id.startswith(node.uuid(4))}
    assert len(holders) == 1
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="52010", pod=holders.pop()) > 0
    node.sim.kubelet._allocations = node.sim.allocations
    s = node.cycle()
    assert one(s, "xpu_process_gpu_memory_used_bytes", pid="52010", pod="", namespace="") > 0
    node.attributor.pod_index = real  # the log directory becomes readable
    s = node.cycle()
    assert pick(s, "xpu_process_gpu_memory_used_bytes", pid="52010", pod="") == {}
