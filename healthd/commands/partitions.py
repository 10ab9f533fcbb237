"""`xpuctl partitions ...`: create, list, get, delete, capacity, mode, renew, and exec a command inside a partition.

Reads go to the daemon's socket (--socket); changes go to the admin socket (--admin-socket, default: the
healthd-admin.sock next to --socket), which only root (or the configured admin group) can open.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from healthd.commands import args as argtypes
from healthd.commands import partition_exec
from healthd.commands.output import enum_label, print_json, print_table, wants_json

if TYPE_CHECKING:
    from healthd.api.v1 import partitions_pb2, partitions_pb2_grpc

MODE_NAMES = {"none": "PARTITION_MODE_NONE", "tdm": "PARTITION_MODE_TDM", "mig": "PARTITION_MODE_MIG"}


def _stub(channel: grpc.Channel) -> partitions_pb2_grpc.PartitionsStub:
    from healthd.api.v1 import partitions_pb2_grpc as pb_grpc

    return pb_grpc.PartitionsStub(channel)


def admin_address(args: argparse.Namespace) -> str:
    if args.admin_socket:
        return str(args.admin_socket)
    env = os.environ.get("XPU_ADMIN_SOCKET")
    if env:
        return env
    socket_addr: str = args.socket
    if socket_addr.startswith("unix:"):
        return "unix:" + os.path.join(os.path.dirname(socket_addr[len("unix:") :]), "healthd-admin.sock")
    raise ValueError("--admin-socket is required when --socket is not a unix socket")


def _owner(args: argparse.Namespace) -> partitions_pb2.Owner:
    from healthd.api.v1 import partitions_pb2 as pb

    given = [x for x in (args.owner_pid, args.owner_container, args.owner_pod, args.owner_lease, args.owner_claim) if x]
    if len(given) > 1:
        raise ValueError("give one owner: --owner-pid, --owner-container, --owner-pod, --owner-lease or --owner-claim")
    if args.owner_claim:
        parts = args.owner_claim.split("/")
        if len(parts) != 3:
            raise ValueError(f"--owner-claim: expected NAMESPACE/NAME/UID, got {args.owner_claim!r}")
        return pb.Owner(claim=pb.ClaimOwner(namespace=parts[0], name=parts[1], uid=parts[2]))
    if args.owner_pid:
        return pb.Owner(process=pb.ProcessOwner(pid=args.owner_pid))
    if args.owner_container:
        return pb.Owner(container=pb.ContainerOwner(id=args.owner_container, cgroup_path=args.cgroup_path or ""))
    if args.owner_pod:
        parts = args.owner_pod.split("/")
        if len(parts) != 3:
            raise ValueError(f"--owner-pod: expected NAMESPACE/POD/CONTAINER, got {args.owner_pod!r}")
        return pb.Owner(pod=pb.PodOwner(namespace=parts[0], name=parts[1], container=parts[2]))
    holder = args.owner_lease or f"xpuctl@{socket.gethostname()}:{os.getuid()}"
    return pb.Owner(lease=pb.LeaseOwner(holder=holder, ttl_seconds=args.ttl))


def _print_partitions(partitions: Sequence[partitions_pb2.Partition]) -> None:
    """One row per partition; for MIG, PROFILE is the profile the daemon picked (COMPUTE and MEMORY are what was
    asked); EXPIRES is when a lease runs out unless renewed (local time, and how long from now)."""
    from healthd.api.v1 import partitions_pb2 as pb

    rows = []
    now = time.time()
    for p in partitions:
        compute = f"{p.compute_percent}%" if p.compute_percent else "-"
        memory = f"{p.memory_limit_bytes // 2**20}MiB" if p.memory_limit_bytes else "-"
        device = p.mig.uuid if p.HasField("mig") else p.cdi_device
        profile = p.mig.profile if p.HasField("mig") else "-"
        expires = _expiry(p.lease_expires_at, now) if p.owner.WhichOneof("kind") == "lease" else "-"
        mode = enum_label(pb.PartitionMode.DESCRIPTOR, p.mode)
        rows.append((p.id, p.gpu, mode, compute, memory, profile, p.state, _describe_owner(p.owner), expires, device))
    print_table(
        ("ID", "GPU", "MODE", "COMPUTE", "MEMORY", "PROFILE", "STATE", "OWNER", "EXPIRES", "DEVICE"),
        rows,
        right=(1, 3, 4),
    )


def _expiry(expires_at: float, now: float) -> str:
    left = int(expires_at - now)
    clock = time.strftime("%H:%M:%S", time.localtime(expires_at))
    if left <= 0:
        return f"{clock} (passed)"
    return (
        f"{clock} ({left // 60}m{left % 60:02d}s)"
        if left < 3600
        else f"{clock} ({left // 3600}h{left % 3600 // 60:02d}m)"
    )


def _describe_owner(owner: partitions_pb2.Owner) -> str:
    which = owner.WhichOneof("kind")
    if which == "container":
        return f"container {owner.container.id[:12]}"
    if which == "pod":
        return f"pod {owner.pod.namespace}/{owner.pod.name}/{owner.pod.container}"
    if which == "process":
        return f"pid {owner.process.pid}"
    if which == "lease":
        return f"lease {owner.lease.holder}"
    if which == "claim":
        return f"claim {owner.claim.namespace}/{owner.claim.name}"
    return "-"


def cmd_create(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    request = pb.CreatePartitionRequest(
        owner=_owner(args),
        gpu=args.gpu,
        compute_percent=args.compute,
        memory=args.memory,
        request_id=args.request_id,
        allow_faulty_gpus=args.allow_faulty_gpus,
    )
    if args.uid is not None:
        request.client_uid = args.uid
    if args.mig_profile:
        request.mig_profile = args.mig_profile
    if args.mig_placement is not None:
        request.mig_placement_start = args.mig_placement
    with grpc.insecure_channel(admin_address(args)) as admin:
        partition = _stub(admin).CreatePartition(request, timeout=args.timeout)
    if wants_json(args):
        print_json(partition)
    else:
        _print_partitions([partition])
    return 0


def cmd_list(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    reply = _stub(channel).ListPartitions(pb.ListPartitionsRequest(gpu=args.gpu), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
    else:
        _print_partitions(reply.partitions)
    return 0


def cmd_get(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    partition = _stub(channel).GetPartition(pb.GetPartitionRequest(id=args.id), timeout=args.timeout)
    if wants_json(args):
        print_json(partition)
    else:
        _print_partitions([partition])
        if partition.HasField("client_uid"):
            print(f"  client uid {partition.client_uid}")
        for key, value in sorted(partition.env.items()):
            print(f"  env {key}={value}")
    return 0


def cmd_delete(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    with grpc.insecure_channel(admin_address(args)) as admin:
        reply = _stub(admin).DeletePartition(pb.DeletePartitionRequest(id=args.id), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
        return 0
    print(f"{reply.id}: {'deleted' if reply.deleted else 'did not exist'}")
    return 0


def cmd_renew(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    with grpc.insecure_channel(admin_address(args)) as admin:
        p = _stub(admin).RenewLease(pb.RenewLeaseRequest(id=args.id, ttl_seconds=args.ttl), timeout=args.timeout)
    if wants_json(args):
        print_json(p)
        return 0
    print(f"{p.id}: lease until {p.lease_expires_at:.0f}")
    return 0


def cmd_mode(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    sharing = {"": pb.TDM_SHARING_DEFAULT, "isolated": pb.TDM_SHARING_ISOLATED, "shared": pb.TDM_SHARING_SHARED}
    request = pb.SetCardModeRequest(gpu=args.gpu, mode=MODE_NAMES[args.mode], sharing=sharing[args.sharing])
    with grpc.insecure_channel(admin_address(args)) as admin:
        card = _stub(admin).SetCardMode(request, timeout=args.timeout)
    if wants_json(args):
        print_json(card)
        return 0
    extra = f", sharing {card.tdm_sharing}" if card.tdm_sharing else ""
    print(f"GPU {card.gpu} ({card.gpu_uuid}): mode {enum_label(pb.PartitionMode.DESCRIPTOR, card.mode)}{extra}")
    return 0


def cmd_capacity(args: argparse.Namespace, channel: grpc.Channel) -> int:
    from healthd.api.v1 import partitions_pb2 as pb

    reply = _stub(channel).GetCapacity(pb.GetCapacityRequest(gpu=args.gpu), timeout=args.timeout)
    if wants_json(args):
        print_json(reply)
        return 0
    rows = []
    for c in reply.cards:
        mode = enum_label(pb.PartitionMode.DESCRIPTOR, c.mode)
        memory = f"{c.memory_allocated_bytes // 2**20}/{c.memory_total_bytes // 2**20}"
        slices = str(c.mig_memory_slices_free) if c.mode == pb.PARTITION_MODE_MIG else "-"
        rows.append(
            (c.gpu, mode, c.tdm_sharing or "-", c.partitions, f"{c.compute_percent_allocated}%", memory, slices,
             len(c.foreign_mig_instances))
        )  # fmt: skip
    header = ("GPU", "MODE", "SHARING", "PARTS", "COMPUTE", "MEMORY (MiB)", "MIG FREE", "FOREIGN")
    print_table(header, rows, right=(0, 3, 4, 5, 6, 7))
    return 0


def cmd_exec(args: argparse.Namespace, channel: grpc.Channel) -> int:
    return partition_exec.exec_in_partition(args, channel, lambda: admin_address(args))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parts = sub.add_parser("partitions", help="GPU partitions: TDM quotas (MPS) and dynamic MIG")
    parts.add_argument(
        "--admin-socket",
        metavar="ADDR",
        help="admin socket for changes (default: env XPU_ADMIN_SOCKET, else healthd-admin.sock next to --socket)",
    )
    ps = parts.add_subparsers(dest="action", required=True)

    create = ps.add_parser("create", help="create a partition")
    create.add_argument("--gpu", type=argtypes.gpu_ref(allow_any=True), default="any", help="GPU index, UUID or 'any'")
    create.add_argument(
        "--compute", type=argtypes.uint(100), default=0, help="compute quota, 1-100 percent of the card (0: no limit)"
    )
    create.add_argument(
        "--memory", type=argtypes.memory, default="", help="memory cap, e.g. 8GiB or 512MiB (multiple of 128 MiB)"
    )
    create.add_argument(
        "--owner-pid", type=argtypes.uint(4194304, 1), default=0, help="owned by this process (reclaimed when it exits)"
    )
    create.add_argument("--owner-container", default="", metavar="ID", help="owned by this container")
    create.add_argument("--cgroup-path", default="", help="the container's cgroup, relative to /sys/fs/cgroup")
    create.add_argument("--owner-pod", default="", metavar="NS/POD/CONTAINER", help="owned by this pod's container")
    create.add_argument("--owner-lease", default="", metavar="HOLDER", help="owned by a lease (default owner)")
    create.add_argument(
        "--owner-claim",
        default="",
        metavar="NS/NAME/UID",
        help="owned by a Kubernetes ResourceClaim (never reclaimed by the daemon: delete it yourself)",
    )
    create.add_argument(
        "--mig-profile", default="", metavar="PROFILE", help="mig: this GPU-instance profile (e.g. 1g.18gb or its id)"
    )
    create.add_argument(
        "--mig-placement",
        type=argtypes.uint(63),
        default=None,
        metavar="START",
        help="with --mig-profile: at this placement start (memory slice; see 'capacity --json')",
    )
    create.add_argument(
        "--allow-faulty-gpus",
        action="store_true",
        help="with --gpu any: also consider cards with faults of action reset_gpu or stronger (skipped by default)",
    )
    create.add_argument("--ttl", type=argtypes.seconds, default=0.0, help="lease seconds (0: the daemon's default)")
    create.add_argument("--request-id", default="", help="idempotency key: a retry returns the same partition")
    create.add_argument(
        "--uid",
        type=argtypes.uint(0xFFFFFFFE),
        default=None,
        help="tdm: the uid the partition's CUDA processes run as; on a card in tdm sharing 'shared' partitions "
        "for another uid are then refused, since its one MPS daemon serves one uid at a time",
    )
    create.set_defaults(func=cmd_create)

    lst = ps.add_parser("list", help="list partitions")
    lst.add_argument("--gpu", type=argtypes.gpu_ref(optional=True), default="", help="only this GPU (index or UUID)")
    lst.set_defaults(func=cmd_list)

    get = ps.add_parser("get", help="show one partition with its environment")
    get.add_argument("id", type=argtypes.partition_id)
    get.set_defaults(func=cmd_get)

    delete = ps.add_parser("delete", help="delete a partition")
    delete.add_argument("id", type=argtypes.partition_id)
    delete.set_defaults(func=cmd_delete)

    renew = ps.add_parser("renew", help="renew a lease-owned partition")
    renew.add_argument("id", type=argtypes.partition_id)
    renew.add_argument("--ttl", type=argtypes.seconds, default=0.0, help="seconds (0: the daemon's default)")
    renew.set_defaults(func=cmd_renew)

    mode = ps.add_parser("mode", help="set a card's partition mode (none, tdm, mig)")
    mode.add_argument("gpu", type=argtypes.gpu_ref(), help="GPU index or UUID")
    mode.add_argument("mode", choices=sorted(MODE_NAMES))
    mode.add_argument(
        "--sharing",
        choices=["isolated", "shared"],
        default="",
        help="tdm only: one MPS daemon per partition (isolated, enforced) or per card (shared, side by side); "
        "default: the daemon's [partitions] tdm_sharing",
    )
    mode.set_defaults(func=cmd_mode)

    cap = ps.add_parser("capacity", help="allocated and free capacity per card")
    cap.add_argument("--gpu", type=argtypes.gpu_ref(optional=True), default="", help="only this GPU (index or UUID)")
    cap.set_defaults(func=cmd_capacity)

    ex = ps.add_parser(
        "exec",
        help="run a command inside a partition, keeping its lease renewed while it runs: "
        "xpuctl partitions exec ID -- CMD [ARGS]",
    )
    ex.add_argument("id", type=argtypes.partition_id)
    ex.add_argument("command", nargs=argparse.REMAINDER)
    ex.set_defaults(func=cmd_exec, prints_result=False)  # it becomes the command: nothing of its own to format
