"""cgroup parsing and PID resolution over fixture proc trees, one per runtime and cgroup layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.cgroup import HOST, CgroupOwner, classify_path, parse_cgroup_file
from exporter.attribution.resolver import ProcResolver

CID = "4f1a2b3c" * 8  # 64 hex digits
UID = "8d3e1c52-6f7a-4b9e-9c1d-2a3b4c5d6e7f"
UID_US = UID.replace("-", "_")

V1_CONTROLLERS = ("memory", "cpu,cpuacct", "devices", "pids", "name=systemd")


def v1(path: str, root_controllers: tuple[str, ...] = ()) -> str:
    """A cgroup v1 file: every controller at ``path``, except ``root_controllers`` left at / (as on real hosts)."""
    lines = [f"{i + 2}:{c}:{'/' if c in root_controllers else path}" for i, c in enumerate(V1_CONTROLLERS)]
    lines.insert(0, "13:rdma:/")
    return "\n".join(lines) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


# (case, /proc/<pid>/cgroup text, expected owner)
CASES: list[tuple[str, str, CgroupOwner]] = [
    (
        "kubelet+containerd, systemd driver, cgroup v2",
        v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
        CgroupOwner(runtime="containerd", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+containerd, guaranteed QoS, systemd driver, cgroup v2",
        v2(f"/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
        CgroupOwner(runtime="containerd", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+containerd, cgroupfs driver, cgroup v1",
        v1(f"/kubepods/besteffort/pod{UID}/{CID}", root_controllers=("pids",)),
        CgroupOwner(runtime="", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+CRI-O, systemd driver, cgroup v2",
        v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice/crio-{CID}.scope"),
        CgroupOwner(runtime="cri-o", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+CRI-O, cgroupfs driver, cgroup v1",
        v1(f"/kubepods/burstable/pod{UID}/crio-{CID}"),
        CgroupOwner(runtime="cri-o", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+Docker (dockershim/cri-dockerd), systemd driver, cgroup v1",
        v1(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/docker-{CID}.scope"),
        CgroupOwner(runtime="docker", container_id=CID, pod_uid=UID),
    ),
    (
        "kubelet+Docker, cgroupfs driver, cgroup v1",
        v1(f"/kubepods/pod{UID}/{CID}"),
        CgroupOwner(runtime="", container_id=CID, pod_uid=UID),
    ),
    (
        "kind-style nested kubelet (kubelet.slice), cgroup v2",
        v2(
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_US}.slice/cri-containerd-{CID}.scope"
        ),
        CgroupOwner(runtime="containerd", container_id=CID, pod_uid=UID),
    ),
    (
        "static pod (32-hex UID), cgroupfs",
        v1(f"/kubepods/burstable/pod0123456789abcdef0123456789abcdef/{CID}"),
        CgroupOwner(runtime="", container_id=CID, pod_uid="0123456789abcdef0123456789abcdef"),
    ),
    (
        "plain Docker, systemd driver, cgroup v2",
        v2(f"/system.slice/docker-{CID}.scope"),
        CgroupOwner(runtime="docker", container_id=CID),
    ),
    (
        "plain Docker, cgroupfs driver, cgroup v1",
        v1(f"/docker/{CID}"),
        CgroupOwner(runtime="docker", container_id=CID),
    ),
    (
        "Podman rootful, cgroup v2",
        v2(f"/machine.slice/libpod-{CID}.scope"),
        CgroupOwner(runtime="podman", container_id=CID),
    ),
    (
        "Podman rootless with the /container child, cgroup v2",
        v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container"),
        CgroupOwner(runtime="podman", container_id=CID),
    ),
    (
        "Podman, cgroupfs manager, cgroup v1",
        v1(f"/libpod_parent/libpod-{CID}"),
        CgroupOwner(runtime="podman", container_id=CID),
    ),
    (
        "systemd service, cgroup v2",
        v2("/system.slice/nvidia-persistenced.service"),
        CgroupOwner(runtime="systemd", unit="nvidia-persistenced.service"),
    ),
    (
        "systemd service, hybrid v1 + v2",
        v1("/system.slice/train-llm.service") + "0::/system.slice/train-llm.service\n",
        CgroupOwner(runtime="systemd", unit="train-llm.service"),
    ),
    (
        "Slurm job, cgroup v2 (slurmstepd.scope)",
        v2("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"),
        CgroupOwner(runtime="slurm", slurm_job="4242"),
    ),
    (
        "Slurm job, cgroup v1",
        v1("/slurm/uid_1000/job_777/step_batch/task_0", root_controllers=("pids", "name=systemd")),
        CgroupOwner(runtime="slurm", slurm_job="777"),
    ),
    (
        "Slurm job, multiple-slurmd v1 (slurm_<node>)",
        v1("/slurm_gpu-node-07/uid_1000/job_9/step_0/task_1"),
        CgroupOwner(runtime="slurm", slurm_job="9"),
    ),
    (
        "login shell on the host",
        v2("/user.slice/user-1000.slice/session-4.scope"),
        CgroupOwner("systemd", unit="session-4.scope"),
    ),
    ("root cgroup", v2("/"), HOST),
    (
        "cgroup namespace: path relative to the reader's namespace",
        v2(f"/../../kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
        CgroupOwner(runtime="containerd", container_id=CID, pod_uid=UID),
    ),
]


# Real layouts the first parser misread, each from a published sample (ids kept as published where the source
# prints them whole).
KIND_NODE = "1c4e7a0b2d3f46a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3"  # the node container (docker)
KIND_POD = "1e597579_417e_482f_bf65_5fe170c3aebd"
KIND_CID = "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"
MINIKUBE_NODE = "85b8af02515cb3e49ca58e7f9d5f59e038a1cb400bec20870842393ee6fe39c4"
MINIKUBE_POD = "12606883-05a6-4572-bb79-ffa847b300fb"
MINIKUBE_CID = "28369cae89b3fa80f9e06cabcaa96b678501d818df1007be653dc6664b3651d7"

REAL_LAYOUTS: list[tuple[str, str, CgroupOwner]] = [
    (
        # Slurm's cgroup/v2 plugin names its scope "<NodeName>_slurmstepd.scope" when slurmd is built for multiple
        # slurmd per host (src/plugins/cgroup/v2/cgroup_v2.c, _set_int_cg_ns; https://slurm.schedmd.com/
        # cgroup_v2.html shows the job_<id>/step_<id>/user/task_<n> tree below it). Node name "gpu-node-07".
        "Slurm multiple-slurmd, cgroup v2",
        v2("/system.slice/gpu-node-07_slurmstepd.scope/job_12/step_0/user/task_0"),
        CgroupOwner(runtime="slurm", slurm_job="12"),
    ),
    (
        "Slurm multiple-slurmd, cgroup v2, batch step",
        v2("/system.slice/gpu-node-07_slurmstepd.scope/job_4242/step_batch/user/task_special"),
        CgroupOwner(runtime="slurm", slurm_job="4242"),
    ),
    (
        # kind: kubelet runs inside the node container with its cgroups under kubelet.slice; the pod and container
        # below are the ones a kind node printed in github.com/containerd/nri/pull/227 (see also
        # github.com/kubernetes-sigs/kind/issues/3947). Seen from the host, the node container's scope comes first.
        "kind node container, cgroup v2 (systemd driver inside the node)",
        v2(
            f"/system.slice/docker-{KIND_NODE}.scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{KIND_POD}.slice/"
            f"cri-containerd-{KIND_CID}.scope"
        ),
        CgroupOwner(runtime="containerd", container_id=KIND_CID, pod_uid=KIND_POD.replace("_", "-")),
    ),
    (
        # k3d on cgroup v2 (github.com/k3d-io/k3d/issues/493): k3s' kubelet, cgroupfs driver, makes /kubepods
        # under the node container's own cgroup.
        "k3d node container, cgroup v2 (cgroupfs driver inside the node)",
        v2(f"/system.slice/docker-{KIND_NODE}.scope/kubepods/besteffort/pod{UID}/{CID}"),
        CgroupOwner(runtime="", container_id=CID, pod_uid=UID),
    ),
    (
        # minikube, docker driver, cgroup v1: the path cAdvisor reported in
        # github.com/kubernetes/minikube/issues/14915, verbatim
        "minikube node container, cgroup v1",
        v1(f"/docker/{MINIKUBE_NODE}/kubepods/besteffort/pod{MINIKUBE_POD}/{MINIKUBE_CID}"),
        CgroupOwner(runtime="", container_id=MINIKUBE_CID, pod_uid=MINIKUBE_POD),
    ),
    (
        "a process of the node container itself (kubelet in kind) stays the node container's",
        v2(f"/system.slice/docker-{KIND_NODE}.scope/kubelet.slice/kubelet.service"),
        CgroupOwner(runtime="docker", container_id=KIND_NODE),
    ),
    (
        "Docker in Docker, cgroup v1: the inner container",
        v1(f"/docker/{MINIKUBE_NODE}/docker/{CID}"),
        CgroupOwner(runtime="docker", container_id=CID),
    ),
    (
        # Documentation/admin-guide/cgroup-v2.rst: when a zombie's cgroup is removed, /proc/<pid>/cgroup shows
        # "0::/test-cgroup/test-cgroup-nested (deleted)".
        "docker container, cgroup removed (deleted)",
        f"0::/system.slice/docker-{CID}.scope (deleted)\n",
        CgroupOwner(runtime="docker", container_id=CID),
    ),
    (
        "pod container, cgroup removed (deleted)",
        v2(f"/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope (deleted)"),
        CgroupOwner(runtime="containerd", container_id=CID, pod_uid=UID),
    ),
    (
        "the kernel's own example of a removed cgroup",
        "0::/test-cgroup/test-cgroup-nested (deleted)\n",
        HOST,
    ),
]


@pytest.mark.parametrize(("case", "text", "expected"), REAL_LAYOUTS, ids=[c[0] for c in REAL_LAYOUTS])
def test_published_layouts(case: str, text: str, expected: CgroupOwner) -> None:
    assert _without_path(parse_cgroup_file(text)) == expected


def test_slurmstepd_scope_is_never_taken_for_a_systemd_unit() -> None:
    owner = classify_path("/system.slice/gpu-node-07_slurmstepd.scope/system")  # slurmstepd itself, no job
    assert owner == HOST


def _without_path(owner: CgroupOwner) -> CgroupOwner:
    return CgroupOwner(owner.runtime, owner.container_id, owner.pod_uid, owner.slurm_job, owner.unit)


@pytest.mark.parametrize(("case", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_fixture_proc_tree_resolves_each_runtime(case: str, text: str, expected: CgroupOwner, tmp_path: Path) -> None:
    pid = 4321
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "cgroup").write_text(text)
    (d / "comm").write_text("python3\n")
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + "123456 0 0\n")
    identity = ProcResolver(tmp_path).resolve(pid)
    assert identity is not None
    assert identity.comm == "python3"
    assert identity.start_time == 123456
    assert _without_path(identity.owner) == expected


def test_conmon_and_init_scopes_are_not_the_workload() -> None:
    assert classify_path(f"/machine.slice/libpod-conmon-{CID}.scope") == HOST
    assert classify_path("/init.scope") == HOST


def test_v1_line_with_more_detail_beats_a_root_v2_line() -> None:
    text = v1(f"/kubepods/burstable/pod{UID}/{CID}") + "0::/\n"
    owner = parse_cgroup_file(text)
    assert owner.pod_uid == UID
    assert owner.container_id == CID


def _stat(pid: int, start: int, comm: str = "python3") -> str:
    return f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{start} 0 0\n"


def test_pid_reuse_is_detected_by_start_time(tmp_path: Path) -> None:
    d = tmp_path / "77"
    d.mkdir()
    (d / "stat").write_text(_stat(77, 1000))
    (d / "comm").write_text("old\n")
    (d / "cgroup").write_text(v2(f"/system.slice/docker-{CID}.scope"))
    resolver = ProcResolver(tmp_path, verify_every=1)  # start time checked on every lookup
    first = resolver.resolve(77)
    assert first is not None
    assert first.owner.container_id == CID
    # same start time: served from the cache even though the files changed under it
    (d / "cgroup").write_text(v2("/system.slice/other.service"))
    assert resolver.resolve(77) is first
    # the kernel reused pid 77 for a new process: new start time -> read again
    (d / "stat").write_text(_stat(77, 2000))
    (d / "comm").write_text("new\n")
    again = resolver.resolve(77)
    assert again is not None
    assert (again.comm, again.owner.unit, again.owner.container_id) == ("new", "other.service", "")


def test_exited_process_resolves_to_none_and_leaves_the_cache(tmp_path: Path) -> None:
    d = tmp_path / "9"
    d.mkdir()
    (d / "stat").write_text(_stat(9, 5, comm="a) b (c"))  # comm with parentheses and spaces
    (d / "cgroup").write_text(v2("/"))
    resolver = ProcResolver(tmp_path, verify_every=1)
    identity = resolver.resolve(9)
    assert identity is not None
    assert identity.start_time == 5
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    assert resolver.resolve(9) is None
    assert resolver.cached == 0


def test_unreadable_cgroup_gives_host_owner_not_a_crash(tmp_path: Path) -> None:
    d = tmp_path / "5"
    d.mkdir()
    (d / "stat").write_text(_stat(5, 1))
    identity = ProcResolver(tmp_path).resolve(5)
    assert identity is not None
    assert identity.owner == HOST
    assert not identity.cgroup_readable


@given(st.text(max_size=400))
def test_parser_never_raises_on_arbitrary_text(text: str) -> None:
    owner = parse_cgroup_file(text)
    assert isinstance(owner, CgroupOwner)
    if owner.container_id:
        assert len(owner.container_id) == 64


@given(st.lists(st.text(alphabet="abcdef0123456789-_./:kubepodslicecrio", max_size=80), max_size=6))
def test_parser_on_path_like_noise(parts: list[str]) -> None:
    owner = classify_path("/".join(parts))
    assert owner.pod_uid == "" or len(owner.pod_uid) in (32, 36)
