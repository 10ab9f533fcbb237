"""MIG on a simulated card, with the rules NVML enforces: legal placements, per-profile instance limits, memory
slices that do not overlap, 7 compute slices per card, and no destroying an instance that processes still use.

Every function here expects the caller to hold ``card.lock``.
"""

from __future__ import annotations

import hashlib
from typing import Final

from exporter.backends.errors import InsufficientResourcesError, InUseError, InvalidStateError, NotFoundError
from exporter.backends.simulated.card import Card, MigGi
from exporter.backends.types import MigInstance, MigProfile

MEMORY_SLICES: Final = 8
COMPUTE_SLICES: Final = 7


def placement_size(profile: MigProfile, start: int) -> int:
    """The memory slices a GPU instance of ``profile`` spans from ``start``; 0 where it may not start."""
    return next((size for s, size in profile.placements if s == start), 0)


def _slices(gi: MigGi) -> range:
    return range(gi.start, gi.start + placement_size(gi.profile, gi.start))


def create_gi(
    card: Card, profiles: tuple[MigProfile, ...], profile_id: int, start: int, gpu_instance_id: int | None = None
) -> MigGi:
    """A new GPU instance of ``profile_id`` at memory slice ``start``, refused as NVML would refuse it.
    ``gpu_instance_id``: the id it had (an instance made again after a daemon restart); else the lowest free one."""
    call = "nvmlDeviceCreateGpuInstanceWithPlacement"
    if not card.mig_current:
        raise InvalidStateError(f"MIG mode is disabled on GPU {card.index}", call=call)
    profile = next((p for p in profiles if p.profile_id == profile_id), None)
    if profile is None:
        raise NotFoundError(f"GPU {card.index} has no MIG profile {profile_id}", call=call)
    size = placement_size(profile, start)
    if size == 0:
        legal = ", ".join(str(s) for s, _ in profile.placements)
        raise InsufficientResourcesError(
            f"profile {profile.name} cannot start at slice {start} (legal starts: {legal})", call=call
        )
    same = sum(1 for g in card.mig.values() if g.profile.profile_id == profile_id)
    if same >= profile.instance_count:
        raise InsufficientResourcesError(
            f"profile {profile.name} allows {profile.instance_count} instance(s) per card", call=call
        )
    used = {slice_ for g in card.mig.values() for slice_ in _slices(g)}
    wanted = set(range(start, start + size))
    if used & wanted:
        raise InsufficientResourcesError(
            f"memory slices {sorted(used & wanted)} on GPU {card.index} are taken", call=call
        )
    compute = sum(g.profile.slice_count for g in card.mig.values())
    if compute + profile.slice_count > COMPUTE_SLICES:
        raise InsufficientResourcesError(f"not enough compute slices left on GPU {card.index}", call=call)
    if gpu_instance_id is not None and gpu_instance_id in card.mig:
        raise InvalidStateError(f"GPU instance {gpu_instance_id} exists on GPU {card.index}", call=call)
    gi_id = gpu_instance_id if gpu_instance_id is not None else next(i for i in range(1, 64) if i not in card.mig)
    digest = hashlib.sha1(f"{card.uuid}/{gi_id}/{start}/{profile_id}".encode()).hexdigest()
    uuid = f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    gi = MigGi(gpu_instance_id=gi_id, profile=profile, start=start, uuid=uuid)
    card.mig[gi_id] = gi
    return gi


def destroy_gi(card: Card, gpu_instance_id: int) -> None:
    """Remove a GPU instance; NotFoundError if it does not exist, InUseError while a process runs in it."""
    if gpu_instance_id not in card.mig:
        raise NotFoundError(f"GPU {card.index} has no GPU instance {gpu_instance_id}", call="nvmlGpuInstanceDestroy")
    users = [p.pid for p in card.procs.values() if p.gpu_instance_id == gpu_instance_id]
    if users:
        raise InUseError(
            f"GPU instance {gpu_instance_id} on GPU {card.index} is in use by pids {users}",
            call="nvmlGpuInstanceDestroy",
        )
    del card.mig[gpu_instance_id]


def mig_instance(card: Card, gi: MigGi) -> MigInstance:
    """The MIG device of a GPU instance as the Backend protocol describes it."""
    used = sum(p.memory_bytes for p in card.procs.values() if p.gpu_instance_id == gi.gpu_instance_id)
    return MigInstance(
        parent_index=card.index,
        gpu_instance_id=gi.gpu_instance_id,
        compute_instance_id=0,
        profile_id=gi.profile.profile_id,
        profile_name=gi.profile.name,
        placement_start=gi.start,
        placement_size=placement_size(gi.profile, gi.start),
        uuid=gi.uuid,
        sm_count=gi.profile.sm_count,
        memory_total_bytes=gi.profile.memory_mib * 2**20,
        memory_used_bytes=used,
    )


def card_sms(profiles: tuple[MigProfile, ...]) -> int:
    """The card's SM count: that of its largest (whole-card) profile."""
    return max((p.sm_count for p in profiles), default=1)


__all__ = [
    "COMPUTE_SLICES",
    "MEMORY_SLICES",
    "card_sms",
    "create_gi",
    "destroy_gi",
    "mig_instance",
    "placement_size",
]
