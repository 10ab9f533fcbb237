"""Snapshot processes + cgroups + kubelet allocations -> who each GPU process belongs to.

Runs once per Snapshot on the sampler thread (``update`` is a sampler subscriber), so a scrape only renders the
finished, immutable ``Attribution``. How a process gets its labels, most certain first:

1. its cgroup names a container id that kubelet's log directory maps to namespace/pod/container;
2. its cgroup names a pod UID that the log directory maps to namespace/pod (container from the pod's only
   container, or from the one container of that pod holding the device);
3. its cgroup says "a Kubernetes pod" but nothing maps the UID: kubelet's pod-resources is asked who holds the
   card (or MIG device); exactly one container -> that one. Several (a shared card) -> left unknown, never guessed;
4. a Docker/Podman container outside Kubernetes: ``container`` is the short container id; a Slurm job: ``job``.

The MPS server process serves every client on its card, so it is never given a pod.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from exporter.attribution.cgroup import CgroupOwner
from exporter.attribution.kubelet import KubeletPodResources, PodResourcesView, split_device_id
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcessIdentity, ProcResolver, is_mps_server
from exporter.backends.types import UNSUPPORTED, GpuProcess
from exporter.snapshot import GpuSnapshot, Snapshot

INDEX_RETRY_SECONDS = 30.0  # a container id or pod UID the log index lacks triggers a rescan at most this often


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str = ""
    pod: str = ""
    container: str = ""
    job: str = ""  # Slurm job id


_NOBODY = Workload()
_NO_HOLDERS: frozenset[Workload] = frozenset()


class AttributedProcess(NamedTuple):
    """One GPU process and who it belongs to. A NamedTuple, not a frozen dataclass: one is built for every process
    whose readings moved, every cycle (3,200 at 64 busy cards), and ``tuple.__new__`` builds one about 4x faster.
    It is as immutable (records are handed to scrape threads) and compares and hashes field by field as the
    dataclass did (the collectors' block versions); unlike it, it also equals a plain tuple of the same values."""

    gpu: int
    uuid: str  # the card's UUID (join key with card metrics)
    gpu_instance_id: str  # MIG GPU instance, "" when the process runs on the whole card
    pid: int
    name: str
    used_memory_bytes: int | None  # None: NVML does not say
    sm_utilization_ratio: float | None
    workload: Workload
    mps_server: bool = False


@dataclass(frozen=True, slots=True)
class Allocation:
    """A kubelet device allocation resolved to a card (and MIG instance) of this node."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str
    gpu: int
    uuid: str
    gpu_instance_id: str


@dataclass(frozen=True, slots=True)
class Attribution:
    seq: int  # the Snapshot it was computed from
    processes: tuple[AttributedProcess, ...]
    allocations: tuple[Allocation, ...]
    kubelet: PodResourcesView | None  # None: kubelet client off
    unmatched_device_ids: int  # allocations naming no device of this node (another vendor, unknown id form)


@dataclass(frozen=True, slots=True)
class _Device:
    gpu: int
    uuid: str
    gpu_instance_id: str


_Seen = tuple[GpuProcess, object, object, object, AttributedProcess]  # per PID: the last cycle's inputs and record
_new_record = tuple.__new__  # builds an AttributedProcess from its fields without the Python-level __new__ call


def _record(gpu: GpuSnapshot, proc: GpuProcess, name: str, workload: Workload, mps: bool) -> AttributedProcess:
    memory = None if proc.used_memory_bytes is UNSUPPORTED else proc.used_memory_bytes
    sm = None if proc.sm_utilization_ratio is UNSUPPORTED else proc.sm_utilization_ratio
    instance = "" if proc.gpu_instance_id is UNSUPPORTED else str(proc.gpu_instance_id)
    return AttributedProcess(gpu.index, gpu.uuid, instance, proc.pid, name, memory, sm, workload, mps)


def _device_index(snapshot: Snapshot) -> dict[str, _Device]:
    """Every id kubelet may use for a device here: GPU UUID, MIG device UUID, nvidiaN (minor number)."""
    out: dict[str, _Device] = {}
    for gpu in snapshot.gpus:
        if gpu.info is None:
            continue
        out[gpu.info.uuid] = _Device(gpu.index, gpu.info.uuid, "")
        if isinstance(gpu.info.minor_number, int):
            out[f"nvidia{gpu.info.minor_number}"] = _Device(gpu.index, gpu.info.uuid, "")
        for inst in gpu.mig_instances:
            out[inst.uuid] = _Device(gpu.index, gpu.info.uuid, str(inst.gpu_instance_id))
    return out


class Attributor:
    def __init__(
        self,
        resolver: ProcResolver,
        *,
        pod_index: PodLogIndex | None = None,
        kubelet: KubeletPodResources | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        checkpoint: Callable[[], None] = lambda: None,
    ) -> None:
        """``checkpoint``: called before each card's processes (the daemon's requests in flight, which it may wait
        for: exporter/inflight.py)."""
        self.resolver = resolver
        self._checkpoint = checkpoint
        self.pod_index = pod_index
        self.kubelet = kubelet
        self._monotonic = monotonic
        self._index_refreshed = False
        self._misses: dict[str, float] = {}  # container id / pod UID -> when it last triggered a rescan
        self._rescans = 0  # lookups that missed the log index (a workload found after one is not remembered)
        # The last cycle's work, reused while its inputs are the same objects: kubelet's allocations (the client
        # keeps the tuple while kubelet's answer is unchanged) and the device index; per PID, the process as NVML
        # listed it, its identity, the holders of its device and the log index it was looked up in (updated in
        # place: the entry of a process listed as before is left as it is, one no card lists is dropped).
        self._last_allocations: tuple[object, dict[str, _Device], tuple[tuple[Allocation, ...], int]] | None = None
        self._last_holders: dict[tuple[str, str], frozenset[Workload]] = {}
        self._processes: dict[int, _Seen] = {}
        self._latest: Attribution | None = None
        self._lock = threading.Lock()

    def latest(self) -> Attribution | None:
        with self._lock:
            return self._latest

    def update(self, snapshot: Snapshot) -> Attribution:
        kubelet_view = self.kubelet.view() if self.kubelet is not None else None
        devices = _device_index(snapshot)
        kept = self._last_allocations
        given = kubelet_view.allocations if kubelet_view is not None else None
        if kept is not None and kept[0] is given and kept[1] == devices:
            allocations, unmatched = kept[2]
            holders = self._last_holders
        else:
            listed, unmatched = self._allocations(kubelet_view, devices)
            allocations = tuple(listed)
            holding: dict[tuple[str, str], set[Workload]] = {}  # (uuid, gpu_instance_id) -> containers holding it
            for a in allocations:
                holding.setdefault((a.uuid, a.gpu_instance_id), set()).add(Workload(a.namespace, a.pod, a.container))
            holders = {k: frozenset(v) for k, v in holding.items()}
            self._last_allocations = (given, devices, (allocations, unmatched))
            self._last_holders = holders
        if not self._index_refreshed and self.pod_index is not None:
            self.pod_index.refresh()
            self._index_refreshed = True
        processes: list[AttributedProcess] = []
        live: list[int] = []
        self.resolver.begin_cycle()
        resolve = self.resolver.resolve
        seen: dict[int, _Seen] = self._processes  # updated in place: a process as last cycle is not written again
        pod_index = self.pod_index

        def index_now() -> tuple[PodLogIndex, int] | None:
            return (pod_index, pod_index.generation) if pod_index is not None else None

        # the log index the lookups are made in: the same for the whole cycle unless a lookup rescans it
        index = index_now()
        checkpoint = self._checkpoint
        for gpu in snapshot.gpus:
            info = gpu.info
            if not gpu.fresh or info is None:
                continue
            checkpoint()
            card, uuid = gpu.index, info.uuid
            whole = holders.get((uuid, ""), _NO_HOLDERS)
            for proc in gpu.processes:
                pid = proc.pid
                live.append(pid)
                identity = resolve(pid)
                instance = proc.gpu_instance_id
                if instance is UNSUPPORTED:
                    gi, held = "", whole
                else:
                    gi = str(instance)
                    held = holders.get((uuid, gi), _NO_HOLDERS)
                last = seen.get(pid)
                if last is not None and last[1] is identity and last[2] is held and last[3] == index:
                    # identity, card holders and log index as last cycle: the same workload. The last record
                    # itself while NVML lists the process as before, else a new one with the new readings, unless
                    # its name changed (which decides whether it is the MPS server). "As before" is the
                    # GpuProcess's equality but for the pid (the key), its most changing field first, inline: the
                    # dataclass __eq__ builds two tuples of every field, and this runs for every process.
                    was, record = last[0], last[4]
                    if (
                        record.gpu == card
                        and record.uuid == uuid
                        and (
                            was is proc
                            or (
                                was.sm_utilization_ratio == proc.sm_utilization_ratio
                                and was.used_memory_bytes == proc.used_memory_bytes
                                and was.gpu_instance_id == proc.gpu_instance_id
                                and was.name == proc.name
                            )
                        )
                    ):
                        # its entry stays: the GpuProcess kept equals this one in every field compared
                        processes.append(record)
                        continue
                    name = proc.name or (identity.comm if identity else "")
                    if name == record.name:
                        memory = proc.used_memory_bytes
                        sm = proc.sm_utilization_ratio
                        record = _new_record(
                            AttributedProcess,
                            (
                                card,
                                uuid,
                                gi,
                                pid,
                                name,
                                None if memory is UNSUPPORTED else memory,
                                None if sm is UNSUPPORTED else sm,
                                record.workload,
                                record.mps_server,
                            ),
                        )
                        seen[pid] = (proc, identity, held, index, record)
                        processes.append(record)
                        continue
                rescans = self._rescans
                attributed = self._attribute(gpu, proc, identity, held)
                processes.append(attributed)
                if rescans != self._rescans:  # looked up after a miss: the next cycle may rescan again
                    index = index_now()  # if it rescanned, the processes after it look again
                    seen.pop(pid, None)
                    continue
                seen[pid] = (proc, identity, held, index, attributed)
        on_cards = set(live)
        for pid in [p for p in seen if p not in on_cards]:  # processes no card lists any more
            del seen[pid]
        self.resolver.retain(on_cards)
        result = Attribution(snapshot.seq, tuple(processes), allocations, kubelet_view, unmatched)
        with self._lock:
            self._latest = result
        return result

    # ----- internals ---------------------------------------------------------------------------------------

    def _attribute(
        self,
        gpu: GpuSnapshot,
        proc: GpuProcess,
        identity: ProcessIdentity | None,
        holders: frozenset[Workload],
    ) -> AttributedProcess:
        name = proc.name or (identity.comm if identity else "")
        mps = is_mps_server(name)
        workload = _NOBODY
        if identity is not None and not mps:
            workload = self._workload(identity.owner, holders)
        return _record(gpu, proc, name, workload, mps)

    def _workload(self, owner: CgroupOwner, holders: frozenset[Workload]) -> Workload:
        if owner.slurm_job:
            return Workload(job=owner.slurm_job)
        if owner.pod_uid:
            return self._pod_workload(owner, holders)
        if owner.container_id:
            return Workload(container=owner.container_id[:12])
        return _NOBODY

    def _pod_workload(self, owner: CgroupOwner, holders: frozenset[Workload]) -> Workload:
        index = self.pod_index
        if index is not None:
            ref = None
            if owner.container_id:
                ref = index.container(owner.container_id)
                if ref is None and self._rescan_for(owner.container_id):
                    ref = index.container(owner.container_id)
            pod = index.pod(owner.pod_uid)
            if pod is None and self._rescan_for(owner.pod_uid):
                pod = index.pod(owner.pod_uid)
            # The container id is the innermost cgroup's name, which a tenant who may write its own cgroup can
            # choose (a child named after another pod's container); the pod UID is kubelet's slice above it. So a
            # container names the workload only when it belongs to the pod the cgroup is in.
            if ref is not None and pod is not None and (ref.namespace, ref.pod) == (pod.namespace, pod.pod):
                return Workload(ref.namespace, ref.pod, ref.container)
            if pod is not None:
                if len(pod.containers) == 1:
                    return Workload(pod.namespace, pod.pod, pod.containers[0])
                mine = {h.container for h in holders if (h.namespace, h.pod) == (pod.namespace, pod.pod)}
                return Workload(pod.namespace, pod.pod, mine.pop() if len(mine) == 1 else "")
        if len(holders) == 1:
            return next(iter(holders))
        return _NOBODY  # shared card and no way to tell its pods apart: unknown, not guessed

    def _rescan_for(self, key: str) -> bool:
        """Rescan kubelet's log directory for an id it lacked: at once for a new container, then rarely, so an id
        that will never be there (log directory not mounted) costs one listing per INDEX_RETRY_SECONDS."""
        if self.pod_index is None:
            return False
        self._rescans += 1
        now = self._monotonic()
        last = self._misses.get(key)
        if last is not None and now - last < INDEX_RETRY_SECONDS:
            return False
        if len(self._misses) > 4096:  # ids of long-gone processes: forget them
            self._misses = {k: t for k, t in self._misses.items() if now - t < INDEX_RETRY_SECONDS}
        self._misses[key] = now
        self.pod_index.refresh()
        return True

    @staticmethod
    def _allocations(view: PodResourcesView | None, devices: dict[str, _Device]) -> tuple[list[Allocation], int]:
        if view is None:
            return [], 0
        out: list[Allocation] = []
        unmatched = 0
        for a in view.allocations:
            base, _replica = split_device_id(a.device_id)
            device = devices.get(base)
            if device is None:
                unmatched += 1
                continue
            out.append(
                Allocation(
                    a.namespace,
                    a.pod,
                    a.container,
                    a.resource_name,
                    a.device_id,
                    device.gpu,
                    device.uuid,
                    device.gpu_instance_id,
                )
            )
        return out, unmatched
