"""Checks of Partitions requests before they reach the manager, and PartitionError -> gRPC status with details.

Every field of every request is checked here: references to cards (ASCII digits or a GPU UUID), partition ids,
owners, quotas, seconds and the idempotency key, each with a length cap. Errors quote at most 100 characters of
what the client sent (healthd/rpc/validation.py).
"""

from __future__ import annotations

import re

import grpc

from healthd.api.v1 import partitions_pb2 as pb
from healthd.partition.errors import Kind, PartitionError, invalid
from healthd.partition.model import Owner, OwnerKind
from healthd.partition.quantity import check_compute_percent, parse_memory_mib
from healthd.rpc.errors import RpcFailure, invalid_argument, not_found
from healthd.rpc.validation import (
    GpuRef,
    InvalidField,
    check_ascii_token,
    check_seconds,
    check_text,
    parse_gpu_ref,
    quote,
)

MAX_ID_CHARS = 64  # partition ids are "p-" + 12 hex digits; room for other schemes, none for abuse
MAX_REQUEST_ID_CHARS = 128
MAX_HOLDER_CHARS = 253
MAX_CGROUP_PATH_CHARS = 4096  # PATH_MAX
MAX_MEMORY_CHARS = 32
MAX_PID = 4194304  # the kernel's largest pid_max
MAX_RESOURCE_NAME_CHARS = 317  # a Kubernetes extended resource name: 253 + '/' + 63
MAX_DEVICE_ID_CHARS = 256
MAX_TTL_SECONDS = 10 * 365 * 86400.0  # the manager applies its own (smaller) limit with its own message
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}", re.ASCII)  # used with fullmatch: "$" would let a "\n" through
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)
_RESOURCE_NAME = re.compile(  # a Kubernetes extended resource name: domain/name
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
CLAIM_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,127}", re.ASCII)  # Kubernetes uids are RFC 4122 UUIDs
MIG_PROFILE = re.compile(r"[0-9]{1,3}|[0-9]+g\.[0-9]+gb(\+[a-z0-9.]+)?", re.ASCII)  # an id, or NVIDIA's profile name
MAX_PLACEMENT_START = 63
MAX_MIG_PROFILE_CHARS = 32
_FIELD_PREFIX = re.compile(r"([a-z_]+(?:\.[a-z_]+)*): (.+)", re.DOTALL)

KIND_STATUS = {
    Kind.INVALID: (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
    Kind.NOT_FOUND: (grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
    Kind.PRECONDITION: (grpc.StatusCode.FAILED_PRECONDITION, "PARTITION_PRECONDITION"),
    Kind.EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED, "CAPACITY_EXHAUSTED"),
    Kind.CONFLICT: (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS"),
    Kind.UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE, "GPU_UNAVAILABLE"),
    Kind.PERMISSION: (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
}


def partition_id(value: str, field: str = "id") -> str:
    return check_ascii_token(value, field, max_chars=MAX_ID_CHARS, required=True)


def gpu_ref(value: str, field: str = "gpu", *, allow_any: bool = False, optional: bool = False) -> GpuRef | None:
    if optional and not value:
        return None
    return parse_gpu_ref(value, field, allow_any=allow_any)


def _name(value: str, field: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(value):
        raise InvalidField(field, f"expected {what}, got {quote(value)}")
    return value


def owner_from_pb(owner: pb.Owner) -> tuple[Owner, float]:
    """(Owner, lease ttl seconds); InvalidField names the first bad field."""
    which = owner.WhichOneof("kind")
    if which == "container":
        c = owner.container
        _name(c.id, "owner.container.id", CONTAINER_ID, "12-64 lowercase hex digits")
        path = check_text(c.cgroup_path, "owner.container.cgroup_path", max_chars=MAX_CGROUP_PATH_CHARS)
        if ".." in path.split("/"):
            raise InvalidField("owner.container.cgroup_path", f"must stay under the cgroup root, got {quote(path)}")
        return Owner(OwnerKind.CONTAINER, container_id=c.id, cgroup_path=path), 0.0
    if which == "pod":
        p = owner.pod
        _name(p.namespace, "owner.pod.namespace", _DNS_LABEL, "a Kubernetes namespace (DNS label)")
        _name(p.name, "owner.pod.name", DNS_SUBDOMAIN, "a Kubernetes pod name (DNS subdomain)")
        _name(p.container, "owner.pod.container", _DNS_LABEL, "a Kubernetes container name (DNS label)")
        resource, device = kubelet_device(p.kubelet_device, "owner.pod.kubelet_device")
        return Owner(
            OwnerKind.POD,
            namespace=p.namespace,
            pod=p.name,
            container=p.container,
            resource_name=resource,
            device_id=device,
        ), 0.0
    if which == "process":
        pid = owner.process.pid
        if not 0 < pid <= MAX_PID:
            raise InvalidField("owner.process.pid", f"must be a process id between 1 and {MAX_PID}, got {pid}")
        return Owner(OwnerKind.PROCESS, pid=pid), 0.0
    if which == "lease":
        holder = check_text(owner.lease.holder, "owner.lease.holder", max_chars=MAX_HOLDER_CHARS, required=True)
        ttl = check_seconds(owner.lease.ttl_seconds, "owner.lease.ttl_seconds", maximum=MAX_TTL_SECONDS)
        resource, device = kubelet_device(owner.lease.kubelet_device, "owner.lease.kubelet_device")
        return Owner(OwnerKind.LEASE, holder=holder, resource_name=resource, device_id=device), ttl
    if which == "claim":
        claim = owner.claim
        _name(claim.namespace, "owner.claim.namespace", _DNS_LABEL, "a Kubernetes namespace (DNS label)")
        _name(claim.name, "owner.claim.name", DNS_SUBDOMAIN, "a ResourceClaim name (DNS subdomain)")
        _name(claim.uid, "owner.claim.uid", CLAIM_UID, "the claim's uid (letters, digits and '-', at most 128)")
        return Owner(OwnerKind.CLAIM, namespace=claim.namespace, claim=claim.name, claim_uid=claim.uid), 0.0
    raise InvalidField("owner", "required: one of container, pod, process, lease or claim")


def check_owner(owner: Owner) -> None:
    """An owner the manager is handed (from a request, or a pod kubelet lists), checked again in the API's terms:
    PartitionError INVALID naming the field."""
    if owner.resource_name or owner.device_id:
        if owner.kind not in (OwnerKind.POD, OwnerKind.LEASE):
            raise invalid("owner: a kubelet device goes with a lease or pod owner only")
        if not _RESOURCE_NAME.fullmatch(owner.resource_name):
            raise invalid(f"kubelet_device.resource_name: expected DOMAIN/NAME, got {owner.resource_name!r}")
        if not owner.device_id or len(owner.device_id) > 256 or not owner.device_id.isprintable():
            raise invalid("kubelet_device.device_id: expected 1-256 printable characters")
    match owner.kind:
        case OwnerKind.CONTAINER:
            if not CONTAINER_ID.fullmatch(owner.container_id):
                raise invalid(
                    f"owner.container.id: expected 12-64 lowercase hex digits, got {quote(owner.container_id)}"
                )
            if owner.cgroup_path and (".." in owner.cgroup_path.split("/") or "\0" in owner.cgroup_path):
                got = quote(owner.cgroup_path)
                raise invalid(f"owner.container.cgroup_path: must stay under the cgroup root: {got}")
        case OwnerKind.POD:
            for name, value in (("namespace", owner.namespace), ("name", owner.pod), ("container", owner.container)):
                if not DNS_SUBDOMAIN.fullmatch(value):
                    raise invalid(f"owner.pod.{name}: expected a Kubernetes name, got {quote(value)}")
        case OwnerKind.PROCESS:
            if owner.pid <= 0:
                raise invalid(f"owner.process.pid: must be a positive PID, got {owner.pid}")
        case OwnerKind.LEASE:
            if not owner.holder or len(owner.holder) > 253 or not owner.holder.isprintable():
                raise invalid("owner.lease.holder: expected a printable name of 1-253 characters")
        case OwnerKind.CLAIM:
            if not _DNS_LABEL.fullmatch(owner.namespace):
                raise invalid(f"owner.claim.namespace: expected a DNS label, got {quote(owner.namespace)}")
            if not DNS_SUBDOMAIN.fullmatch(owner.claim):
                raise invalid(f"owner.claim.name: expected a DNS subdomain, got {quote(owner.claim)}")
            if not CLAIM_UID.fullmatch(owner.claim_uid):
                raise invalid(f"owner.claim.uid: expected a Kubernetes uid, got {quote(owner.claim_uid)}")


def kubelet_device(device: pb.KubeletDevice, field: str) -> tuple[str, str]:
    """(resource name, device id) of the kubelet device a partition serves; both empty when none is named."""
    resource = check_text(device.resource_name, f"{field}.resource_name", max_chars=MAX_RESOURCE_NAME_CHARS)
    device_id = check_text(device.device_id, f"{field}.device_id", max_chars=MAX_DEVICE_ID_CHARS)
    if bool(resource) != bool(device_id):
        raise InvalidField(field, "give both resource_name and device_id, or neither")
    return resource, device_id


def compute_percent(value: int) -> int:
    try:
        return check_compute_percent(value)
    except PartitionError as exc:
        raise InvalidField("compute_percent", exc.message.split(": ", 1)[-1]) from None


def memory_mib(text: str) -> int:
    if len(text) > MAX_MEMORY_CHARS:
        raise InvalidField("memory", f"at most {MAX_MEMORY_CHARS} characters, got {quote(text, 40)}")
    try:
        return parse_memory_mib(text)
    except PartitionError as exc:
        raise InvalidField("memory", exc.message.split(": ", 1)[-1]) from None


NO_UID = 0xFFFFFFFF  # (uid_t)-1: "no uid" to the kernel (setuid ignores it), never a process's uid


def client_uid(request: pb.CreatePartitionRequest) -> int | None:
    """The optional ``client_uid`` of a create request: None when unset."""
    if not request.HasField("client_uid"):
        return None
    uid = int(request.client_uid)
    if uid == NO_UID:
        raise InvalidField("client_uid", f"{uid} is (uid_t)-1, which no process runs as")
    return uid


def mig_choice(request: pb.CreatePartitionRequest) -> tuple[str, int | None]:
    """(profile, placement start) a create names explicitly; ("", None) when the daemon chooses."""
    profile = request.mig_profile
    start = int(request.mig_placement_start) if request.HasField("mig_placement_start") else None
    if not profile:
        if start is not None:
            raise InvalidField("mig_placement_start", "goes with mig_profile only")
        return "", None
    if len(profile) > MAX_MIG_PROFILE_CHARS or not MIG_PROFILE.fullmatch(profile):
        raise InvalidField("mig_profile", f"expected a profile name like 1g.18gb or a profile id, got {quote(profile)}")
    if request.compute_percent or request.memory not in ("", "0"):
        raise InvalidField("mig_profile", "names the instance itself: leave compute_percent and memory unset")
    if request.gpu.strip().lower() == "any":
        raise InvalidField("mig_profile", 'needs a named card (index or UUID), not "any"')
    if start is not None and start > MAX_PLACEMENT_START:
        raise InvalidField("mig_placement_start", f"must be a memory slice 0-{MAX_PLACEMENT_START}, got {start}")
    return profile, start


def request_id(value: str) -> str:
    return check_text(value, "request_id", max_chars=MAX_REQUEST_ID_CHARS)


def ttl_seconds(value: float, field: str = "ttl_seconds") -> float:
    return check_seconds(value, field, maximum=MAX_TTL_SECONDS)


def to_failure(exc: PartitionError, resource: tuple[str, str] | None = None) -> RpcFailure:
    """The status for a manager error; ``resource`` (type, name) is what a NOT_FOUND refers to."""
    code, reason = KIND_STATUS[exc.kind]
    if exc.kind is Kind.INVALID:
        match = _FIELD_PREFIX.fullmatch(exc.message)
        field, description = (match.group(1), match.group(2)) if match else ("", exc.message)
        return invalid_argument(field, description)
    if exc.kind is Kind.NOT_FOUND and resource is not None:
        return not_found(resource[0], resource[1], exc.message)
    return RpcFailure(code, exc.message, reason=reason)
