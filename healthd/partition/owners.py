"""Whether a partition's owner still exists: a container's cgroup, a process, a pod, or an unexpired lease. A
ResourceClaim owner always counts as alive: the daemon cannot see claims, and only their DRA driver deletes them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from exporter.attribution.kubelet import DeviceListing
from healthd.partition.model import Owner, OwnerKind

PodExists = Callable[[str, str], "bool | None"]  # (namespace, name) -> True/False, None when unknown
# (resource name, device id) -> (namespace, pod, container) for every device kubelet lists; None when unknown
DeviceHolders = Callable[[], "DeviceListing | None"]

CGROUP_SEARCH_DEPTH = 8


def process_start_ticks(proc_root: Path, pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when the process does not exist."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


class OwnerProbe:
    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        pod_exists: PodExists | None = None,
        device_holders: DeviceHolders | None = None,
        clock: Callable[[], float],
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.pod_exists = pod_exists
        self.device_holders = device_holders
        self.clock = clock

    def alive(self, owner: Owner, lease_expires_at: float) -> bool | None:
        """True, False, or None when it cannot be told (then nothing is reclaimed)."""
        match owner.kind:
            case OwnerKind.PROCESS:
                ticks = process_start_ticks(self.proc_root, owner.pid)
                if ticks is None:
                    return False
                return owner.pid_start_ticks == 0 or ticks == owner.pid_start_ticks
            case OwnerKind.CONTAINER:
                if owner.cgroup_path:
                    return (self.cgroup_root / owner.cgroup_path.lstrip("/")).is_dir()
                return self._find_cgroup(owner.container_id)
            case OwnerKind.POD if owner.device_id:
                holders = self.device_holders() if self.device_holders is not None else None
                if holders is None:
                    return None
                holder = holders.holders.get((owner.resource_name, owner.device_id))
                return holder is not None and holder[:2] == (owner.namespace, owner.pod)
            case OwnerKind.POD:
                if self.pod_exists is None:
                    return None
                return self.pod_exists(owner.namespace, owner.pod)
            case OwnerKind.LEASE:
                return self.clock() < lease_expires_at
            case OwnerKind.CLAIM:
                return True  # the DRA driver deletes it (unprepare, or its reconcile once the claim is gone)

    def _find_cgroup(self, container_id: str) -> bool | None:
        """Search the cgroup tree for a directory named after the container (cri-containerd-ID.scope, docker-ID...)."""
        if not self.cgroup_root.is_dir():
            return None
        base_depth = len(self.cgroup_root.parts)
        for dirpath, dirnames, _ in os.walk(self.cgroup_root):
            if any(container_id in d for d in dirnames):
                return True
            if len(Path(dirpath).parts) - base_depth >= CGROUP_SEARCH_DEPTH:
                dirnames.clear()
        return False
