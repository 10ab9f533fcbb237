"""Plain values of the partition service: card modes, owners, partitions as stored."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class CardMode(enum.StrEnum):
    NONE = "none"
    TDM = "tdm"
    MIG = "mig"


class OwnerKind(enum.StrEnum):
    CONTAINER = "container"
    POD = "pod"
    PROCESS = "process"
    LEASE = "lease"
    CLAIM = "claim"  # a Kubernetes ResourceClaim: never reclaimed by the daemon, only deleted by its creator


class State(enum.StrEnum):
    CREATING = "creating"  # intent recorded; the GPU side may or may not exist yet (resolved at restart)
    READY = "ready"
    DELETING = "deleting"  # delete started; the GPU side is being torn down (retried until it is gone)


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
    claim: str = ""  # ResourceClaim name (namespace above)
    claim_uid: str = ""

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
            case OwnerKind.CLAIM:
                return f"claim {self.namespace}/{self.claim} ({self.claim_uid})"


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
