"""Pod and container names from kubelet's log directories, without the API server.

kubelet creates, for every pod and container it runs, ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/`` and
the symlink ``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` (the layout log shippers
read). Pod names, namespaces and container names cannot contain ``_``, so both names split unambiguously. This
turns the container id and pod UID found in a process's cgroup into names, which the pod-resources API cannot do
(it lists names and devices, not UIDs or container ids).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

_CONTAINER_LINK = re.compile(r"^(?P<pod>[^_]+)_(?P<namespace>[^_]+)_(?P<container>[^_]+)-(?P<id>[0-9a-f]{64})\.log$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    pod: str
    uid: str
    containers: tuple[str, ...]


_EMPTY_C: Mapping[str, ContainerRef] = MappingProxyType({})
_EMPTY_P: Mapping[str, PodRef] = MappingProxyType({})


class PodLogIndex:
    """Container id -> names and pod UID -> names, rebuilt by ``refresh()`` (a directory listing, no file reads)."""

    def __init__(self, log_root: Path) -> None:
        self.log_root = log_root
        self._containers = _EMPTY_C
        self._pods = _EMPTY_P
        self._generation = 0

    @property
    def present(self) -> bool:
        return bool(self._pods) or bool(self._containers)

    @property
    def generation(self) -> int:
        """Counts refreshes: lookups made at the same generation give the same answers."""
        return self._generation

    def refresh(self) -> None:
        pods: dict[str, PodRef] = {}
        for entry in _scandir(self.log_root / "pods"):
            parts = entry.name.split("_")
            if len(parts) != 3 or not entry.is_dir(follow_symlinks=False):
                continue
            namespace, pod, uid = parts
            names = tuple(sorted(c.name for c in _scandir(Path(entry.path)) if c.is_dir(follow_symlinks=False)))
            pods[uid] = PodRef(namespace, pod, uid, names)
        containers: dict[str, ContainerRef] = {}
        for entry in _scandir(self.log_root / "containers"):
            m = _CONTAINER_LINK.match(entry.name)
            if m:
                containers[m["id"]] = ContainerRef(m["namespace"], m["pod"], m["container"])
        # swap whole mappings: readers on other threads see the old or the new index, never a half-built one
        self._pods, self._containers = MappingProxyType(pods), MappingProxyType(containers)
        self._generation += 1

    def container(self, container_id: str) -> ContainerRef | None:
        return self._containers.get(container_id)

    def pod(self, uid: str) -> PodRef | None:
        return self._pods.get(uid)


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
