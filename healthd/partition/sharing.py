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
