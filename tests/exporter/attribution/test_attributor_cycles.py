"""The Attributor across cycles, on snapshots whose process lists the test writes: a process whose inputs are
unchanged keeps its workload (its record itself while NVML lists it as before), a rescan of the log index in the
middle of a cycle reaches the processes after it in that cycle and the ones before it in the next, and a PID on
two cards gets each card's record."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from exporter.attribution.attributor import AttributedProcess, Attribution, Attributor, Workload
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.backends.types import UNSUPPORTED, GpuProcess
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot

NS = "team"


def _uid(pod: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"test://{pod}"))


def _cid(pod: str, container: str) -> str:
    return hashlib.sha256(f"{pod}/{container}".encode()).hexdigest()


def _write_proc(root: Path, pid: int, pod: str, container: str, *, start: int = 1000) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{start} 0 0\n")
    (d / "comm").write_text("python3\n")
    slice_ = f"kubepods-burstable-pod{_uid(pod).replace('-', '_')}.slice"
    scope = f"cri-containerd-{_cid(pod, container)}.scope"
    (d / "cgroup").write_text(f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/{scope}\n")


def _write_logs(root: Path, pod: str, container: str, *, named: str | None = None) -> None:
    """kubelet's log entries of a pod's container; ``named``: the name they give the pod (default: its own)."""
    name = named or pod
    pod_dir = root / "log" / "pods" / f"{NS}_{name}_{_uid(pod)}" / container
    pod_dir.mkdir(parents=True, exist_ok=True)
    (pod_dir / "0.log").touch()
    containers = root / "log" / "containers"
    containers.mkdir(parents=True, exist_ok=True)
    (containers / f"{name}_{NS}_{container}-{_cid(pod, container)}.log").symlink_to(pod_dir / "0.log")


def _rename_pod(root: Path, pod: str, container: str, new_name: str) -> None:
    """The log entries of ``pod`` now name it ``new_name`` (same UID and container id)."""
    for link in (root / "log" / "containers").glob(f"{pod}_{NS}_{container}-*.log"):
        link.unlink()
    (root / "log" / "pods" / f"{NS}_{pod}_{_uid(pod)}").rename(root / "log" / "pods" / f"{NS}_{new_name}_{_uid(pod)}")
    new_dir = root / "log" / "pods" / f"{NS}_{new_name}_{_uid(pod)}" / container
    (root / "log" / "containers" / f"{new_name}_{NS}_{container}-{_cid(pod, container)}.log").symlink_to(
        new_dir / "0.log"
    )


@pytest.fixture
def base() -> Iterator[Snapshot]:
    """A real Snapshot of two simulated cards, whose process lists each test replaces."""
    sampler = Sampler(SimulatedBackend.from_name("h200x8"), SamplerSettings(interval_seconds=60))
    yield sampler.run_once()
    sampler.stop()


def _on_cards(base: Snapshot, *cards: Sequence[GpuProcess]) -> Snapshot:
    """``base`` with card i listing ``cards[i]`` (cards past the given ones list nothing)."""
    gpus = tuple(
        dataclasses.replace(g, processes=tuple(cards[i]) if i < len(cards) else ()) for i, g in enumerate(base.gpus)
    )
    assert all(g.fresh and g.info is not None for g in gpus[: len(cards)])
    return dataclasses.replace(base, gpus=gpus)


def _proc(pid: int, sm: float, memory: int = 2**30) -> GpuProcess:
    return GpuProcess(pid, memory, sm, UNSUPPORTED, "")


def _by_pid(result: Attribution) -> dict[int, AttributedProcess]:
    return {p.pid: p for p in result.processes}


def _fields(p: AttributedProcess) -> tuple[object, ...]:
    return (
        p.gpu,
        p.uuid,
        p.gpu_instance_id,
        p.pid,
        p.name,
        p.used_memory_bytes,
        p.sm_utilization_ratio,
        p.workload,
        p.mps_server,
    )


def _attributor(root: Path) -> Attributor:
    return Attributor(ProcResolver(root / "proc"), pod_index=PodLogIndex(root / "log"))


def test_an_unchanged_process_keeps_its_record_and_a_moved_reading_gets_a_new_one(
    tmp_path: Path, base: Snapshot
) -> None:
    _write_proc(tmp_path, 100, "a", "w")
    _write_logs(tmp_path, "a", "w")
    attributor = _attributor(tmp_path)
    first = _by_pid(attributor.update(_on_cards(base, [_proc(100, 0.5)])))[100]
    assert (first.workload, first.gpu, first.uuid, first.gpu_instance_id) == (
        Workload(NS, "a", "w"),
        0,
        base.gpus[0].uuid,
        "",
    )
    again = _by_pid(attributor.update(_on_cards(base, [_proc(100, 0.5)])))[100]
    assert again is first  # listed as before (an equal, new GpuProcess): the record itself
    moved = _by_pid(attributor.update(_on_cards(base, [_proc(100, 0.25, 2**31)])))[100]
    assert _fields(moved) == (*_fields(first)[:5], 2**31, 0.25, *_fields(first)[7:])
    unknown = _by_pid(attributor.update(_on_cards(base, [GpuProcess(100, UNSUPPORTED, UNSUPPORTED, UNSUPPORTED)])))
    assert _fields(unknown[100]) == (*_fields(first)[:5], None, None, *_fields(first)[7:])


def test_a_rescan_in_the_middle_of_a_cycle_reaches_the_processes_after_it_and_before_it(
    tmp_path: Path, base: Snapshot
) -> None:
    """The log index's answers may change when it is rescanned: a process remembered from an earlier generation
    is looked up again, whether it comes after the rescan in the same cycle or before it (then next cycle)."""
    _write_proc(tmp_path, 100, "a", "w")  # card 0, before the rescan
    _write_proc(tmp_path, 200, "b", "w")  # card 1, after it
    for pod in ("a", "b"):
        _write_logs(tmp_path, pod, "w")
    attributor = _attributor(tmp_path)
    cards = ([_proc(100, 0.5)], [_proc(200, 0.5)])
    for _ in range(2):
        result = _by_pid(attributor.update(_on_cards(base, *cards)))
        assert {pid: p.workload.pod for pid, p in result.items()} == {100: "a", 200: "b"}
    _rename_pod(tmp_path, "a", "w", "a2")
    _rename_pod(tmp_path, "b", "w", "b2")
    result = _by_pid(attributor.update(_on_cards(base, *cards)))
    assert {pid: p.workload.pod for pid, p in result.items()} == {100: "a", 200: "b"}, "no rescan: the old answers"
    # a new container of pod a on card 0, which the log index lacks: its lookup rescans the index mid-cycle
    _write_proc(tmp_path, 150, "a", "new")
    cards = ([_proc(100, 0.5), _proc(150, 0.5)], [_proc(200, 0.5)])
    result = _by_pid(attributor.update(_on_cards(base, *cards)))
    assert result[200].workload == Workload(NS, "b2", "w"), "a process after the rescan kept the old index's answer"
    assert result[150].workload == Workload(NS, "a2", "w")  # the pod's only container as the index knows it
    result = _by_pid(attributor.update(_on_cards(base, *cards)))
    assert result[100].workload == Workload(NS, "a2", "w"), "a process before the rescan kept the old index's answer"
    assert result[200].workload == Workload(NS, "b2", "w")


def test_a_pid_on_two_cards_gets_each_cards_record_every_cycle(tmp_path: Path, base: Snapshot) -> None:
    _write_proc(tmp_path, 100, "a", "w")
    _write_logs(tmp_path, "a", "w")
    attributor = _attributor(tmp_path)
    for sm in (0.5, 0.5, 0.25):
        result = attributor.update(_on_cards(base, [_proc(100, sm)], [_proc(100, sm / 2)]))
        cards = [(p.gpu, p.uuid, p.sm_utilization_ratio, p.workload.pod) for p in result.processes]
        assert cards == [(0, base.gpus[0].uuid, sm, "a"), (1, base.gpus[1].uuid, sm / 2, "a")]


def test_a_process_no_card_lists_is_forgotten_and_its_pid_reused_later_gets_the_new_owner(
    tmp_path: Path, base: Snapshot
) -> None:
    for pid, pod in ((100, "a"), (200, "b")):
        _write_proc(tmp_path, pid, pod, "w")
        _write_logs(tmp_path, pod, "w")
    _write_logs(tmp_path, "c", "w")
    attributor = _attributor(tmp_path)
    both = ([_proc(100, 0.5)], [_proc(200, 0.5)])
    for _ in range(2):
        assert {p.pid: p.workload.pod for p in attributor.update(_on_cards(base, *both)).processes} == {
            100: "a",
            200: "b",
        }
    result = attributor.update(_on_cards(base, [_proc(100, 0.5)]))  # pid 200 exits
    assert [(p.pid, p.workload.pod) for p in result.processes] == [(100, "a")]
    assert sorted(attributor._processes) == [100] and attributor.resolver.cached == 1  # kept state is bounded
    _write_proc(tmp_path, 200, "c", "w", start=2000)  # the kernel hands pid 200 to a process of pod c
    result = attributor.update(_on_cards(base, *both))
    assert {p.pid: p.workload.pod for p in result.processes} == {100: "a", 200: "c"}


def test_the_mps_server_by_the_name_proc_keeps_is_nobody_s(tmp_path: Path, base: Snapshot) -> None:
    """The real NVML lists no names, so a real node knows the MPS server by its comm, which the kernel cuts to 15
    bytes: it is still the server, held by no pod, whichever pod's cgroup it runs in."""
    _write_proc(tmp_path, 100, "mps", "server")
    _write_proc(tmp_path, 200, "a", "w")
    (tmp_path / "proc" / "100" / "comm").write_text("nvidia-cuda-mps\n")
    for pod, container in (("mps", "server"), ("a", "w")):
        _write_logs(tmp_path, pod, container)
    result = _by_pid(_attributor(tmp_path).update(_on_cards(base, [_proc(100, 0.0), _proc(200, 0.5)])))
    assert (result[100].name, result[100].mps_server) == ("nvidia-cuda-mps", True)
    assert result[100].workload != Workload(NS, "mps", "server")
    assert (result[200].mps_server, result[200].workload) == (False, Workload(NS, "a", "w"))
