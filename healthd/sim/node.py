"""Simulation only: the node around the simulated GPUs, so pod attribution runs unchanged under --simulate.

For each simulated GPU process this writes what a real node would have: ``<root>/proc/<pid>/{stat,comm,cgroup}``
(kubelet + containerd, systemd cgroup driver, cgroup v2 paths) and kubelet's log directory entries
(``<root>/log/pods/<ns>_<pod>_<uid>/<container>/``, ``<root>/log/containers/<pod>_<ns>_<container>-<id>.log``),
and serves the devices those pods hold over a real gRPC pod-resources server on ``<root>/kubelet/kubelet.sock``.
The daemon's real parser, log index and gRPC client read them, exactly as they read /proc, /var/log and kubelet's
socket on a real node. Pods live as long as they have a simulated process.

The tree follows the simulated processes as they start and exit (the backend tells ``sync`` when its workloads
change), as a kernel's /proc does, not the daemon's sampling: a process is there before any Snapshot lists it,
whatever reads the Snapshots or whether anything does.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import structlog

from exporter.attribution.api.podresources.v1 import api_pb2 as pb
from exporter.attribution.api.podresources.v1 import api_pb2_grpc
from exporter.attribution.kubelet import NO_BDP_PROBE, DeviceAllocation
from exporter.backends.simulated import PodPlacement, SimulatedBackend, SimulatedWorkload
from healthd.host.view import kubelet_socket_path

log = structlog.get_logger("simulation")

GPU_RESOURCE = "nvidia.com/gpu"


def pod_uid(namespace: str, pod: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"xpu-sim://{namespace}/{pod}"))


def container_id(namespace: str, pod: str, container: str) -> str:
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()


def pod_cgroup(placement: PodPlacement) -> str:
    uid = pod_uid(placement.namespace, placement.pod).replace("-", "_")
    cid = container_id(placement.namespace, placement.pod, placement.container)
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{cid}.scope\n"


def allocations_of(workloads: Sequence[SimulatedWorkload]) -> list[DeviceAllocation]:
    """What the NVIDIA device plugin would have kubelet report: a card (or MIG device) per container; a card
    several containers share is split into replicas ``<uuid>::N`` (time-slicing), one per container."""
    holders: dict[str, set[PodPlacement]] = defaultdict(set)
    for w in workloads:
        if w.pod is not None:
            holders[w.mig_uuid or w.uuid].add(w.pod)
    out: list[DeviceAllocation] = []
    for device, pods in sorted(holders.items()):
        ordered = sorted(pods, key=lambda p: (p.namespace, p.pod, p.container))
        shared = len(ordered) > 1
        for n, p in enumerate(ordered):
            device_id = f"{device}::{n}" if shared else device
            out.append(DeviceAllocation(p.namespace, p.pod, p.container, GPU_RESOURCE, device_id))
    return out


class SimulatedKubelet:
    """A real gRPC PodResourcesLister (v1) server on a unix socket, answering from ``allocations()``.

    The List reply is built once per change of the allocations and served again while they are equal. On a real
    node that reply is kubelet's work, in kubelet's process, not the daemon's; building it afresh on every call
    would charge the daemon's CPU (the simulator runs inside it) for what a real node never asks of it. The reply
    itself is the same message either way."""

    def __init__(
        self,
        socket_path: Path,
        allocations: Callable[[], Sequence[DeviceAllocation]],
        allocatable: Callable[[], Sequence[tuple[str, str]]] = tuple,
    ) -> None:
        self.socket_path = socket_path
        self._allocations = allocations
        self._allocatable = allocatable
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()
        self._listed: tuple[Sequence[DeviceAllocation], pb.ListPodResourcesResponse] | None = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="sim-kubelet"), options=[NO_BDP_PROBE]
        )
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def list_response(self) -> pb.ListPodResourcesResponse:
        allocations = self._allocations()
        with self._lock:
            listed = self._listed
            if listed is not None and (listed[0] is allocations or listed[0] == allocations):
                return listed[1]
        reply = self._build_list(allocations)
        with self._lock:
            self._listed = (allocations, reply)
        return reply

    @staticmethod
    def _build_list(allocations: Sequence[DeviceAllocation]) -> pb.ListPodResourcesResponse:
        pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        for a in allocations:
            containers = pods.setdefault((a.namespace, a.pod), {})
            containers.setdefault(a.container, {}).setdefault(a.resource_name, []).append(a.device_id)
        return pb.ListPodResourcesResponse(
            pod_resources=[
                pb.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[
                        pb.ContainerResources(
                            name=cname,
                            devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in res.items()],
                        )
                        for cname, res in containers.items()
                    ],
                )
                for (namespace, name), containers in sorted(pods.items())
            ]
        )

    def allocatable_response(self) -> pb.AllocatableResourcesResponse:
        by_resource: dict[str, list[str]] = defaultdict(list)
        for resource, device_id in self._allocatable():
            by_resource[resource].append(device_id)
        return pb.AllocatableResourcesResponse(
            devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in sorted(by_resource.items())]
        )


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: SimulatedKubelet) -> None:
        self._owner = owner

    def List(  # noqa: N802
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        return self._owner.list_response()

    def GetAllocatableResources(  # noqa: N802
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        return self._owner.allocatable_response()


class SimulatedNode:
    """Keeps ``<root>`` in step with the simulated processes: ``start`` writes it and follows the backend."""

    def __init__(
        self,
        backend: SimulatedBackend,
        root: Path,
        *,
        ticks: Callable[[], float] = time.monotonic,
        serve_kubelet: bool = True,  # false: a real kubelet (or a test double) answers pod-resources instead
    ) -> None:
        self.backend = backend
        self.serve_kubelet = serve_kubelet
        self.root = root
        self.proc_root = root / "proc"
        self.log_root = root / "log"
        self.kubelet = SimulatedKubelet(kubelet_socket_path(root), self.allocations, self._allocatable)
        self._ticks = ticks
        self._lock = threading.Lock()  # the workloads the kubelet answers from
        self._syncing = threading.Lock()  # one sync at a time: injections come from any thread
        self._unwatch: Callable[[], None] | None = None
        self._workloads: tuple[SimulatedWorkload, ...] = ()
        self._allocations_made: tuple[tuple[SimulatedWorkload, ...], tuple[DeviceAllocation, ...]] | None = None
        self._written: dict[int, str] = {}  # pid -> what its cgroup says (to notice a moved process)
        self._pods_written: set[tuple[str, str, str]] = set()

    def start(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)  # leftovers of an earlier run are not this run's processes
        for d in (self.proc_root, self.log_root / "pods", self.log_root / "containers"):
            d.mkdir(parents=True, exist_ok=True)
        self._unwatch = self.backend.watch_workloads(self.sync)
        self.sync()
        if self.serve_kubelet:
            self.kubelet.start()
        log.info("simulated node: proc tree, kubelet logs and pod-resources socket", root=str(self.root))

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self.serve_kubelet:
            self.kubelet.stop()

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        """What kubelet lists now; the same tuple while the simulated workloads are unchanged."""
        with self._lock:
            workloads = self._workloads
            made = self._allocations_made
            if made is not None and made[0] is workloads:
                return made[1]
        allocations = tuple(allocations_of(workloads))
        with self._lock:
            self._allocations_made = (workloads, allocations)
        return allocations

    def _allocatable(self) -> list[tuple[str, str]]:
        return [(GPU_RESOURCE, self.backend.scenario.cards[i].uuid) for i in range(len(self.backend.scenario.cards))]

    def sync(self) -> None:
        """Write what changed in the simulated processes since the last sync."""
        with self._syncing:
            self._sync(self.backend.workloads())

    def _sync(self, workloads: tuple[SimulatedWorkload, ...]) -> None:
        with self._lock:
            if workloads == self._workloads:
                return  # nothing started, exited or moved since the last sync
        live = {w.pid for w in workloads}
        for pid in [p for p in self._written if p not in live]:
            shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)
            del self._written[pid]
        for w in workloads:
            cgroup = pod_cgroup(w.pod) if w.pod else f"0::/system.slice/{w.name}-{w.pid}.service\n"
            if self._written.get(w.pid) != cgroup:
                self._write_proc(w, cgroup)
                self._written[w.pid] = cgroup
        pods = {(w.pod.namespace, w.pod.pod, w.pod.container) for w in workloads if w.pod}
        for ns, pod, container in pods - self._pods_written:
            self._write_logs(ns, pod, container)
        for ns, pod, container in self._pods_written - pods:
            self._remove_logs(ns, pod, container)
        self._pods_written = pods
        with self._lock:
            self._workloads = workloads

    def _write_proc(self, w: SimulatedWorkload, cgroup: str) -> None:
        d = self.proc_root / str(w.pid)
        d.mkdir(parents=True, exist_ok=True)
        start = int(self._ticks() * 100)  # clock ticks (USER_HZ 100), as field 22 of /proc/<pid>/stat
        fields = ["S", "1", str(w.pid), str(w.pid), "0", "-1", "4194560", *["0"] * 12, str(start), "0", "0"]
        (d / "comm").write_text(w.name[:15] + "\n")
        (d / "cgroup").write_text(cgroup)
        (d / "stat").write_text(f"{w.pid} ({w.name[:15]}) {' '.join(fields)}\n")

    def _write_logs(self, namespace: str, pod: str, container: str) -> None:
        pod_dir = self.log_root / "pods" / f"{namespace}_{pod}_{pod_uid(namespace, pod)}" / container
        pod_dir.mkdir(parents=True, exist_ok=True)
        (pod_dir / "0.log").touch()
        link = (
            self.log_root
            / "containers"
            / f"{pod}_{namespace}_{container}-{container_id(namespace, pod, container)}.log"
        )
        if not link.is_symlink():
            link.symlink_to(pod_dir / "0.log")

    def _container_link(self, namespace: str, pod: str, container: str) -> Path:
        cid = container_id(namespace, pod, container)
        return self.log_root / "containers" / f"{pod}_{namespace}_{container}-{cid}.log"

    def _remove_logs(self, namespace: str, pod: str, container: str) -> None:
        link = (
            self.log_root
            / "containers"
            / f"{pod}_{namespace}_{container}-{container_id(namespace, pod, container)}.log"
        )
        link.unlink(missing_ok=True)
        pod_dir = self.log_root / "pods" / f"{namespace}_{pod}_{pod_uid(namespace, pod)}"
        shutil.rmtree(pod_dir / container, ignore_errors=True)
        if pod_dir.is_dir() and not any(pod_dir.iterdir()):
            pod_dir.rmdir()
