"""Plain values of the partition service: card modes, owners, partitions as stored."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from healthd.partition.errors import invalid
from healthd.rpc.validation import quote


class CardMode(enum.StrEnum):
    NONE = "none"
    TDM = "tdm"
    MIG = "mig"


class OwnerKind(enum.StrEnum):
    CONTAINER = "container"
    POD = "pod"
    PROCESS = "process"
    LEASE = "lease"


class State(enum.StrEnum):
    CREATING = "creating"  # intent recorded; the GPU side may or may not exist yet (resolved at restart)
    READY = "ready"
    DELETING = "deleting"  # delete started; the GPU side is being torn down (retried until it is gone)


CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}", re.ASCII)  # used with fullmatch: "$" would let a "\n" through
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)
_RESOURCE_NAME = re.compile(  # a Kubernetes extended resource name: domain/name
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII
)


@dataclass(frozen=True, slots=True)
class Owner:
    kind: OwnerKind
    container_id: str = ""
    cgroup_path: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pid: int = 0
    pid_start_ticks: int = 0  # /proc/PID/stat starttime, to tell a reused PID from the owner
    holder: str = ""
    # the kubelet device the partition serves (lease and pod owners; see KubeletDevice in partitions.proto)
    resource_name: str = ""
    device_id: str = ""

    def describe(self) -> str:
        device = f" for {self.resource_name} {self.device_id}" if self.device_id else ""
        match self.kind:
            case OwnerKind.CONTAINER:
                return f"container {self.container_id[:12]}"
            case OwnerKind.POD:
                return f"pod {self.namespace}/{self.pod} container {self.container}{device}"
            case OwnerKind.PROCESS:
                return f"pid {self.pid}"
            case OwnerKind.LEASE:
                return f"lease {self.holder}{device}"

    def validate(self) -> None:
        if self.resource_name or self.device_id:
            if self.kind not in (OwnerKind.POD, OwnerKind.LEASE):
                raise invalid("owner: a kubelet device goes with a lease or pod owner only")
            if not _RESOURCE_NAME.fullmatch(self.resource_name):
                raise invalid(f"kubelet_device.resource_name: expected DOMAIN/NAME, got {self.resource_name!r}")
            if not self.device_id or len(self.device_id) > 256 or not self.device_id.isprintable():
                raise invalid("kubelet_device.device_id: expected 1-256 printable characters")
        match self.kind:
            case OwnerKind.CONTAINER:
                if not CONTAINER_ID.fullmatch(self.container_id):
                    got = quote(self.container_id)
                    raise invalid(f"owner.container.id: expected 12-64 lowercase hex digits, got {got}")
                if self.cgroup_path and (".." in self.cgroup_path.split("/") or "\0" in self.cgroup_path):
                    got = quote(self.cgroup_path)
                    raise invalid(f"owner.container.cgroup_path: must stay under the cgroup root: {got}")
            case OwnerKind.POD:
                for name, value in (("namespace", self.namespace), ("name", self.pod), ("container", self.container)):
                    if not DNS_SUBDOMAIN.fullmatch(value):
                        raise invalid(f"owner.pod.{name}: expected a Kubernetes name, got {quote(value)}")
            case OwnerKind.PROCESS:
                if self.pid <= 0:
                    raise invalid(f"owner.process.pid: must be a positive PID, got {self.pid}")
            case OwnerKind.LEASE:
                if not self.holder or len(self.holder) > 253 or not self.holder.isprintable():
                    raise invalid("owner.lease.holder: expected a printable name of 1-253 characters")


@dataclass(frozen=True, slots=True)
class MigPlacement:
    profile_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    id: str
    gpu: int
    gpu_uuid: str
    mode: CardMode
    compute_percent: int
    memory_mib: int
    owner: Owner
    state: State
    created_at: float
    lease_expires_at: float = 0.0
    request_id: str = ""
    request_fingerprint: str = ""
    mig: MigPlacement | None = None
    extra: dict[str, str] = field(default_factory=dict)
    client_uid: int | None = None  # TDM: the uid its CUDA processes run as, when the creator said (sharing.py)
