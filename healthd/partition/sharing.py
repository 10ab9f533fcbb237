"""How the TDM partitions of one card share it: which MPS control daemon serves a partition, and with what limits.

This is the one seam between the partition manager (create, delete, recovery, reconcile, CDI edits) and MPS. A
card's policy is chosen when its mode is set to TDM, and kept with the card's mode in the state store.

- ``isolated``: one control daemon per partition, its quota set as the daemon's defaults. A control daemon's
  defaults are ceilings its clients cannot raise (measured on an H200, driver 580), so each partition is held to
  its quota whatever its processes set. The price: each partition has its own MPS server, so the partitions of
  one card run in separate contexts that the GPU time-slices between, instead of side by side.
- ``shared``: one control daemon per card, with no default limit (100 %), so the partitions' clients run side by
  side in one MPS server. Each partition's quota reaches its clients as ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in their environment (the CDI edits). This is cooperative, like AWS ECS's
  MPS allocations and NVIDIA's device plugin: a client can lower its share, and can raise it up to the daemon's
  default, which is the whole card. Why 100 % and not the largest quota on the card: a running MPS server keeps
  the default it started with, so a ceiling at "the largest quota" would have to restart the server (and every
  client on the card) whenever a larger partition arrived; and any ceiling above a partition's quota leaves that
  partition's clients free to take more anyway.

One uid per ``shared`` card. The control daemon runs one MPS server at a time per uid: "If there's an MPS server
already running, but with a different user id than that of the client process, the control daemon requests the
existing server to shutdown as soon as all its clients are done" (nvidia-cuda-mps-control(1), unchanged up to the
580 man page; a multi-user mode, ``-m``, exists only in MPS v3). On a ``shared`` card every partition is a client of
that one daemon, so a second uid's process would wait in cuInit, with no error, until every process of the first
uid has gone. ``admit_uid`` refuses that at creation instead: partitions that state their clients' uid
(``client_uid``) must all state the same one, and a card whose partitions state none refuses one that states a
uid, and the other way round, since either side could be any uid. Partitions that state none are the creator's
word that their clients share one uid (a device plugin cannot know a pod's uid when it allocates). ``isolated``
gives each partition its own daemon, so its uid concerns that partition only.

A third policy belongs here, beside these two: MPS v3 (driver r615+) namespaces inside one server, each with its
own thread percentage and pinned-memory limit, with clients routed to their namespace by cgroup, and cgroup v2
``dmem`` limits for hard memory caps. It would give concurrent *and* enforced quotas. It is not written yet because
nothing here has run on a v3 driver; it needs a control-daemon launcher speaking the v3 module/verb syntax, a
namespace per partition instead of a daemon, and routing of each container's cgroup.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from healthd.partition.errors import UidConflictError
from healthd.partition.model import CardMode, PartitionRecord
from healthd.partition.mps import MpsSupervisor
from healthd.partition.mps_spec import MpsDaemonSpec


class SharingPolicy(enum.StrEnum):
    ISOLATED = "isolated"
    SHARED = "shared"


@dataclass(frozen=True, slots=True)
class CardSharing:
    """A card's policy applied through the MPS supervisor; every method is blocking (run it off the loop)."""

    policy: SharingPolicy
    mps: MpsSupervisor

    def daemon(self, record: PartitionRecord) -> MpsDaemonSpec:
        """The control daemon that serves ``record`` (its pipe directory is what the client needs)."""
        if self.policy is SharingPolicy.SHARED:
            return self.mps.spec_for(shared_daemon_id(record.gpu_uuid), record.gpu_uuid, 0, 0)
        return self.mps.spec_for(record.id, record.gpu_uuid, record.compute_percent, record.memory_mib)

    def admit_uid(self, gpu: int, client_uid: int | None, on_card: Sequence[PartitionRecord]) -> None:
        """Refuse (FAILED_PRECONDITION) a partition whose clients would wait for another uid's on a shared card."""
        if self.policy is not SharingPolicy.SHARED:
            return
        tdm = [r for r in on_card if r.mode is CardMode.TDM]
        if not tdm:
            return
        holder = tdm[0]
        why = (
            f"GPU {gpu} shares one MPS control daemon among its partitions (tdm sharing shared), and "
            "it serves one uid at a time: a client of another uid would wait, without an error, until every process "
            "of the first had exited"
        )
        if client_uid is not None and holder.client_uid is not None and client_uid != holder.client_uid:
            raise UidConflictError(
                f"{why}. Its partition {holder.id} is for uid {holder.client_uid}, this one for uid {client_uid}: "
                f"use another card, or one in tdm sharing isolated"
            )
        if client_uid is not None and holder.client_uid is None:
            raise UidConflictError(
                f"{why}. Its partition {holder.id} did not give its clients' uid, so uid {client_uid} cannot be "
                "checked against it: give client_uid for every partition of the card, or none"
            )
        if client_uid is None and holder.client_uid is not None:
            raise UidConflictError(
                f"{why}. Its partitions are for uid {holder.client_uid} ({holder.id}): give client_uid "
                f"{holder.client_uid} if this partition's clients run as that uid, or use another card"
            )

    def ensure(self, record: PartitionRecord) -> None:
        """The partition's daemon runs (started, or found running after a restart of ours)."""
        self.mps.ensure(self.daemon(record))

    def release(self, record: PartitionRecord, others: Sequence[PartitionRecord]) -> None:
        """``record`` is going away; ``others`` are the card's TDM partitions that stay."""
        if self.policy is SharingPolicy.SHARED and any(r.mode is CardMode.TDM for r in others):
            return  # the card's daemon still serves the others
        self.mps.release(self.daemon(record))


def shared_daemon_id(gpu_uuid: str) -> str:
    return "card-" + gpu_uuid.removeprefix("GPU-")
