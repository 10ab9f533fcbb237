"""What a card holds and has left: derived from its partitions, mode, MIG profiles and foreign instances."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from exporter.backends.types import DeviceInfo, MigInstance, MigProfile, Unsupported
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
    mig_memory_slices: int = 0  # MIG mode on in hardware: the card's memory slices
    driver_version: str = ""
    compute_capability: tuple[int, int] | None = None

    @property
    def architecture(self) -> str:
        return architecture(self.compute_capability)


# CUDA compute capability (major, minor) -> NVIDIA's architecture name (CUDA C Programming Guide, "Compute
# Capabilities"); a major alone covers every minor of it not listed.
ARCHITECTURES: Mapping[tuple[int, int | None], str] = MappingProxyType(
    {
        (7, 0): "Volta",
        (7, 2): "Volta",
        (7, 5): "Turing",
        (8, None): "Ampere",
        (8, 9): "Ada Lovelace",
        (9, None): "Hopper",
        (10, None): "Blackwell",
        (12, None): "Blackwell",
    }
)


def architecture(capability: tuple[int, int] | None) -> str:
    if capability is None:
        return ""
    return ARCHITECTURES.get(capability) or ARCHITECTURES.get((capability[0], None), "")


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
    driver_version: str = "",
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
        mig_memory_slices=planner.card_memory_slices(profiles) if hardware_mig else 0,
        driver_version=driver_version,
        compute_capability=None if isinstance(info.compute_capability, Unsupported) else info.compute_capability,
    )
