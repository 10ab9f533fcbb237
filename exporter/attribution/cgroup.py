"""/proc/<pid>/cgroup -> who owns the process: a Kubernetes pod and container, a Docker or Podman container, a
Slurm job or a systemd unit.

Recognised layouts (cgroup v1 ``N:controllers:/path`` lines and the v2 ``0::/path`` line):

- kubelet, systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>
  .slice/<runtime>-<id>.scope`` with runtime ``cri-containerd``, ``crio`` or ``docker``;
- kubelet, cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (``crio-<id>`` under CRI-O);
- Docker: ``/system.slice/docker-<id>.scope`` (systemd) or ``/docker/<id>`` (cgroupfs);
- Podman: ``/machine.slice/libpod-<id>.scope`` (also below a user's ``user@UID.service`` when rootless, possibly
  with a ``/container`` child), ``/libpod_parent/libpod-<id>`` (cgroupfs);
- Kubernetes inside a node container (kind, k3d, minikube's docker driver): the node container's cgroup comes
  first, the pod's below it, e.g. ``/system.slice/docker-<node>.scope/kubepods/besteffort/pod<uid>/<id>`` or
  ``/docker/<node>/kubepods/...``; the innermost container is the process's, and a pod owns only the container
  below it;
- Slurm: ``/slurm/uid_U/job_J/step_S/...`` (v1, ``slurm_<node>`` with multiple slurmd) and
  ``/system.slice/slurmstepd.scope/job_J/step_S/...`` (v2, ``<node>_slurmstepd.scope`` with multiple slurmd);
- systemd: the innermost ``*.service`` (or non-runtime ``*.scope``) unit.

cgroup v2 appends `` (deleted)`` to the path of a process whose cgroup was removed after it exited (a zombie,
Documentation/admin-guide/cgroup-v2.rst); the owner is read from the path without it.

Parsing is pure: it takes the file's text and returns a value, so every layout is tested from fixture text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEX_ID = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"

# ``kubepods-burstable-pod<uid>.slice`` (systemd) or ``pod<uid>`` (cgroupfs). Static pods have a 32-hex UID.
_POD_SEGMENT = re.compile(
    rf"^(?:kubelet-)?(?:kubepods(?:-(?:burstable|besteffort|guaranteed))?-)?pod({_UID})(?:\.slice)?$"
)
# ``<prefix>-<id>.scope`` (systemd) or ``<prefix>-<id>`` (cgroupfs CRI-O/Podman); conmon scopes are not the container.
_RUNTIME_SEGMENT = re.compile(rf"^(cri-containerd|crio|docker|libpod)-({_HEX_ID})(?:\.scope)?$")
_BARE_ID = re.compile(rf"^{_HEX_ID}$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
# Slurm's root: /slurm (v1), /slurm_<node> (v1, multiple slurmd), [<node>_]slurmstepd.scope (v2)
_SLURM_ROOT = re.compile(r"^(?:slurm(?:_[^/]+)?|(?:[^/]+_)?slurmstepd\.scope)$")
_UNIT = re.compile(r"^[^/]+\.(service|scope)$")
# managers and wrappers that are not the workload: a user's systemd instance, conmon, slurmstepd
_NOT_A_UNIT = re.compile(r"^(user@\d+\.service|.*conmon.*\.scope|(?:[^/]+_)?slurmstepd\.scope|init\.scope)$")
_DELETED = " (deleted)"

_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a process's cgroup says about it. Empty strings mean "not known from the cgroup"."""

    runtime: str = ""  # containerd, cri-o, docker, podman, slurm, systemd ("" for a plain host process)
    container_id: str = ""  # 64 hex digits
    pod_uid: str = ""  # Kubernetes pod UID, dashed form
    slurm_job: str = ""
    unit: str = ""  # systemd unit, e.g. nvidia-persistenced.service
    path: str = ""  # the cgroup path the answer came from

    @property
    def in_kubernetes_pod(self) -> bool:
        return bool(self.pod_uid)

    def _weight(self) -> int:
        return 4 * bool(self.pod_uid) + 2 * bool(self.container_id) + 2 * bool(self.slurm_job) + bool(self.unit)


HOST = CgroupOwner()


def classify_path(path: str) -> CgroupOwner:
    """One cgroup path -> its owner (``HOST`` when nothing is recognised)."""
    segments = [s for s in path.split("/") if s and s not in (".", "..")]
    pod_uid = container_id = runtime = slurm_job = unit = ""
    in_kubepods = in_docker = in_slurm = False
    for seg in segments:
        if "kubepods" in seg:
            in_kubepods = True
        if in_kubepods and not pod_uid and (m := _POD_SEGMENT.match(seg)):
            # a container above the pod is the node's (kind, k3d), not the pod's: only one below it counts
            pod_uid = _dashed(m.group(1))
            container_id = runtime = ""
            in_docker = False
            continue
        if m := _RUNTIME_SEGMENT.match(seg):  # the innermost container wins
            runtime, container_id = _RUNTIMES[m.group(1)], m.group(2)
            continue
        if _BARE_ID.match(seg):
            container_id = seg
            runtime = "docker" if in_docker else ""
            continue
        if seg == "docker":
            in_docker = True
        if _SLURM_ROOT.match(seg):
            in_slurm = True
        if in_slurm and (m := _SLURM_JOB.match(seg)):
            slurm_job = m.group(1)
            continue
        if _UNIT.match(seg) and not _NOT_A_UNIT.match(seg):
            unit = seg  # the innermost one wins
    if pod_uid:
        # the container runtime under kubelet: from the scope name, or unknown for bare cgroupfs ids
        return CgroupOwner(runtime=runtime, container_id=container_id, pod_uid=pod_uid, path=path)
    if container_id:
        return CgroupOwner(runtime=runtime or "container", container_id=container_id, path=path)
    if slurm_job:
        return CgroupOwner(runtime="slurm", slurm_job=slurm_job, path=path)
    if unit:
        return CgroupOwner(runtime="systemd", unit=unit, path=path)
    return HOST


def parse_cgroup_file(text: str) -> CgroupOwner:
    """The contents of /proc/<pid>/cgroup -> the most specific owner any of its lines names.

    On hybrid and v1 hosts each controller has its own line; they normally agree, but some controllers stay at
    the root. The v2 line wins ties, then file order.
    """
    best = HOST
    candidates: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            candidates.insert(0, path.removesuffix(_DELETED))  # v2 only: the kernel appends it on no v1 line
        else:
            candidates.append(path)
    for path in candidates:
        owner = classify_path(path)
        if owner._weight() > best._weight():
            best = owner
    return best


def _dashed(uid: str) -> str:
    """systemd slice names carry the pod UID with underscores instead of dashes."""
    return uid.replace("_", "-")
