"""`xpuctl partitions exec ID -- CMD`: run a command with a partition's environment, and keep the partition for as
long as the command runs.

The command runs as a child of xpuctl, which waits for it and exits with its status (128 + N when signal N ended
it). While it runs, xpuctl renews a lease-owned partition's lease through the admin socket whenever a third of the
time left has passed (each renewal for as long as was left when exec started), so a job outlives the lease it was
created with. Partitions owned by a process, container or pod need no renewal. SIGTERM and SIGHUP given to xpuctl
go to the command; SIGINT (Ctrl-C at a terminal reaches both) is left to the command, and xpuctl waits for it to
end. Once the command has ended the lease is no longer renewed and runs out as it would without exec (delete the
partition to free it at once).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from healthd.api.v1 import partitions_pb2

FORWARDED = (signal.SIGTERM, signal.SIGHUP)
MIN_RENEW_SECONDS = 0.5
MAX_RENEW_SECONDS = 60.0
RETRY_SECONDS = 2.0  # after a renewal that failed (daemon restarting, for one)


def command_of(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("exec: give a command after the id, e.g. `xpuctl partitions exec ID -- python3 x.py`")
    return command


def renew_every(expires_at: float, now: float) -> float:
    """Seconds until the next renewal: a third of the time left, within bounds."""
    return min(MAX_RENEW_SECONDS, max(MIN_RENEW_SECONDS, (expires_at - now) / 3))


class LeaseKeeper:
    """Renews one lease through the admin socket; says once on stderr when it cannot."""

    def __init__(self, partition: partitions_pb2.Partition, admin: str, timeout: float) -> None:
        self.partition_id = partition.id
        self.expires_at = partition.lease_expires_at
        self.ttl = max(1.0, self.expires_at - time.time())  # what was left at the start, renewed each time
        self._admin = admin
        self._timeout = timeout
        self._warned = ""

    def next_wait(self) -> float:
        return renew_every(self.expires_at, time.time())

    def renew(self) -> float:
        """Renew now; the seconds until the next try."""
        from healthd.api.v1 import partitions_pb2 as pb
        from healthd.api.v1 import partitions_pb2_grpc as pb_grpc

        try:
            with grpc.insecure_channel(self._admin) as channel:
                stub = pb_grpc.PartitionsStub(channel)
                request = pb.RenewLeaseRequest(id=self.partition_id, ttl_seconds=self.ttl)
                renewed = stub.RenewLease(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if self._warned != code:
                self._warned = code
                print(
                    f"xpuctl: cannot renew the lease of partition {self.partition_id} ({code}: {details}); "
                    f"it ends at {time.strftime('%H:%M:%S', time.localtime(self.expires_at))} unless renewed",
                    file=sys.stderr,
                    flush=True,
                )
            return RETRY_SECONDS
        if self._warned:
            print(f"xpuctl: lease of partition {self.partition_id} renewed again", file=sys.stderr, flush=True)
            self._warned = ""
        self.expires_at = renewed.lease_expires_at
        return self.next_wait()


def run_in_partition(command: list[str], env: dict[str, str], keeper: LeaseKeeper | None) -> int:
    """Run ``command`` to its end, renewing the lease meanwhile; its exit status the shell's way."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise ValueError(f"exec {command[0]}: {exc.strerror}") from None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command decides what Ctrl-C does
    try:
        wait = keeper.next_wait() if keeper is not None else None
        while True:
            try:
                code = child.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                assert keeper is not None
                wait = keeper.renew()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def exec_in_partition(args: argparse.Namespace, channel: grpc.Channel, admin: Callable[[], str]) -> int:
    """Run a command with the partition's environment (bare metal, development) while keeping the partition;
    ``admin``: the admin socket's address (asked only for a lease-owned partition)."""
    from healthd.api.v1 import partitions_pb2 as pb
    from healthd.api.v1 import partitions_pb2_grpc as pb_grpc

    command = command_of(args)
    partition = pb_grpc.PartitionsStub(channel).GetPartition(pb.GetPartitionRequest(id=args.id), timeout=args.timeout)
    if partition.state != "ready":
        raise ValueError(f"partition {partition.id} is {partition.state}, not ready")
    keeper = None
    if partition.owner.WhichOneof("kind") == "lease":
        keeper = LeaseKeeper(partition, admin(), args.timeout)
    sys.stdout.flush()
    return run_in_partition(command, {**os.environ, **dict(partition.env)}, keeper)
