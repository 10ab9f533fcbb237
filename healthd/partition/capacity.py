"""What a card holds and has left: derived from its partitions, mode, MIG profiles and foreign instances."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.backends.types import DeviceInfo, MigInstance, MigProfile
from healthd.partition import planner
from healthd.partition.model import CardMode, PartitionRecord
from healthd.partition.quantity import MIB


@dataclass(frozen=True, slots=True)
class CardCapacity:
    gpu: int
    gpu_uuid: str
    mode: CardMode
    partitions: int
    compute_percent_allocated: int
    memory_allocated_mib: int
    memory_total_mib: int
    mig_memory_slices_free: int
    foreign: tuple[MigInstance, ...]
    hardware_mig: bool
    sharing: str = ""  # TDM sharing policy of a TDM card
    mig_room: tuple[tuple[MigProfile, int], ...] = ()  # MIG mode, with room=True: (profile, how many more fit now)


@dataclass(frozen=True, slots=True)
class View:
    """An immutable picture for metrics and reads."""

    partitions: tuple[PartitionRecord, ...]
    cards: tuple[CardCapacity, ...]


def card_capacity(
    info: DeviceInfo,
    ours: Sequence[PartitionRecord],
    mode: CardMode,
    profiles: Sequence[MigProfile],
    foreign: tuple[MigInstance, ...],
    hardware_mig: bool,
    sharing: str = "",
    *,
    room: bool = False,
) -> CardCapacity:
    """``room``: also work out ``mig_room`` (the placement search is the costly part; only capacity replies read it)."""
    total_mib = info.memory_total_bytes // MIB
    mig_room: Sequence[tuple[MigProfile, int]] = ()
    if mode is CardMode.MIG and profiles:
        by_id = {p.profile_id: p for p in profiles}
        total_sm = planner.card_sm_count(profiles)
        sms = sum(by_id[r.mig.profile_id].sm_count for r in ours if r.mig and r.mig.profile_id in by_id)
        memory = sum(by_id[r.mig.profile_id].memory_mib for r in ours if r.mig and r.mig.profile_id in by_id)
        used_slices = {
            s
            for start, size in [(r.mig.placement_start, r.mig.placement_size) for r in ours if r.mig]
            + [(i.placement_start, i.placement_size) for i in foreign]
            for s in range(start, start + size)
        }
        slices_free = planner.card_memory_slices(profiles) - len(used_slices)
        compute = sms * 100 // total_sm if total_sm else 0
        if room:
            ours_placed = [r.mig for r in ours if r.mig and r.mig.profile_id in by_id]  # unknown profile: skipped
            mig_room = planner.profile_room(profiles, planner.occupied(profiles, [*ours_placed, *foreign]))
    else:
        compute = sum(r.compute_percent for r in ours)
        memory = sum(r.memory_mib for r in ours)
        slices_free = 0
    return CardCapacity(
        gpu=info.index,
        gpu_uuid=info.uuid,
        mode=mode,
        partitions=len(ours),
        compute_percent_allocated=compute,
        memory_allocated_mib=memory,
        memory_total_mib=total_mib,
        mig_memory_slices_free=slices_free,
        foreign=foreign,
        hardware_mig=hardware_mig,
        sharing=sharing if mode is CardMode.TDM else "",
        mig_room=tuple(mig_room),
    )
