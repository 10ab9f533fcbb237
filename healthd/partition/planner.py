"""Pure admission and placement: TDM quota sums, MIG profile choice and placement scoring. No I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.backends.types import MigProfile
from healthd.partition.errors import PartitionError, exhausted, invalid, precondition


@dataclass(frozen=True, slots=True)
class Quota:
    compute_percent: int  # 0: no limit (reserves nothing)
    memory_mib: int  # 0: no limit (reserves nothing)


def admit_tdm(existing: Iterable[Quota], request: Quota, card_memory_mib: int) -> None:
    """Raise RESOURCE_EXHAUSTED when the request would push the card's quotas over 100 % or its memory."""
    if request.memory_mib > card_memory_mib:
        raise invalid(f"memory: {request.memory_mib} MiB is more than the card has ({card_memory_mib} MiB)")
    used = list(existing)
    compute = sum(q.compute_percent for q in used)
    memory = sum(q.memory_mib for q in used)
    if compute + request.compute_percent > 100:
        raise exhausted(
            f"compute: {request.compute_percent} % asked, {100 - compute} % left on the card ({compute} % allocated)"
        )
    if memory + request.memory_mib > card_memory_mib:
        raise exhausted(
            f"memory: {request.memory_mib} MiB asked, {card_memory_mib - memory} MiB left on the card "
            f"({memory} of {card_memory_mib} MiB allocated)"
        )


@dataclass(frozen=True, slots=True)
class Occupied:
    """A GPU instance that exists on the card (ours or foreign): its memory slices and compute slices."""

    profile_id: int
    start: int
    size: int
    compute_slices: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


class Placed(Protocol):
    """A MIG instance, or the placement of one: MigInstance and MigPlacement both are."""

    @property
    def profile_id(self) -> int: ...
    @property
    def placement_start(self) -> int: ...
    @property
    def placement_size(self) -> int: ...


def occupied(profiles: Sequence[MigProfile], placed: Iterable[Placed]) -> list[Occupied]:
    """The instances on a card as Occupied; compute slices from their profile (0 for one not in ``profiles``)."""
    slice_count = {p.profile_id: p.slice_count for p in profiles}
    return [
        Occupied(i.profile_id, i.placement_start, i.placement_size, slice_count.get(i.profile_id, 0)) for i in placed
    ]


@dataclass(frozen=True, slots=True)
class MigChoice:
    profile: MigProfile
    start: int
    size: int


def card_sm_count(profiles: Sequence[MigProfile]) -> int:
    return max((p.sm_count for p in profiles), default=0)


def card_compute_slices(profiles: Sequence[MigProfile]) -> int:
    return max((p.slice_count for p in profiles), default=0)


def card_memory_slices(profiles: Sequence[MigProfile]) -> int:
    return max((s + n for p in profiles for s, n in p.placements), default=0)


def covers(profile: MigProfile, request: Quota, total_sm: int) -> bool:
    """Whether a profile gives at least the requested share of SMs and memory."""
    return profile.sm_count * 100 >= request.compute_percent * total_sm and profile.memory_mib >= request.memory_mib


def _size_key(p: MigProfile) -> tuple[int, int, int, int, bool, int]:
    size = max((n for _, n in p.placements), default=0)
    # smallest first: memory slices taken, compute slices, memory, SMs; plain profiles before media (+me) ones
    return (size, p.slice_count, p.memory_mib, p.sm_count, "+" in p.name, p.profile_id)


def feasible_starts(profile: MigProfile, occupied: Sequence[Occupied], compute_slices: int) -> list[tuple[int, int]]:
    """Legal (start, size) placements of a profile that are free now, honouring instance and compute limits."""
    if sum(1 for o in occupied if o.profile_id == profile.profile_id) >= profile.instance_count:
        return []
    if sum(o.compute_slices for o in occupied) + profile.slice_count > compute_slices:
        return []
    taken = {s for o in occupied for s in o.slices}
    return [(s, n) for s, n in profile.placements if not taken.intersection(range(s, s + n))]


def _room_after(profiles: Sequence[MigProfile], occupied: Sequence[Occupied], compute_slices: int) -> tuple[int, int]:
    """How much a layout leaves for later requests: the largest placeable profile, then how many placements remain."""
    largest = 0
    count = 0
    for p in profiles:
        starts = feasible_starts(p, occupied, compute_slices)
        if starts:
            largest = max(largest, max(n for _, n in starts) * 16 + p.slice_count)
            count += len(starts)
    return largest, count


def _keeps_most_room(
    profiles: Sequence[MigProfile],
    occupied: Sequence[Occupied],
    profile: MigProfile,
    starts: Sequence[tuple[int, int]],
    compute_slices: int,
) -> tuple[int, int]:
    """The free (start, size) of ``profile`` that leaves most room for later requests (lowest start on a tie)."""
    return max(
        starts,
        key=lambda sn: (
            _room_after(
                profiles, [*occupied, Occupied(profile.profile_id, sn[0], sn[1], profile.slice_count)], compute_slices
            ),
            -sn[0],
        ),
    )


def choose_mig(profiles: Sequence[MigProfile], occupied: Sequence[Occupied], request: Quota) -> MigChoice:
    """The smallest profile covering the request that can be placed now, at the placement that keeps most room."""
    if not profiles:
        raise invalid("this card reports no MIG profiles")
    if request.compute_percent == 0 and request.memory_mib == 0:
        raise invalid("a MIG partition needs compute_percent or memory to choose a profile")
    total_sm = card_sm_count(profiles)
    compute_slices = card_compute_slices(profiles)
    candidates = sorted((p for p in profiles if covers(p, request, total_sm)), key=_size_key)
    if not candidates:
        biggest = max(profiles, key=lambda p: (p.sm_count, p.memory_mib))
        raise invalid(
            f"no MIG profile of this card covers {request.compute_percent} % compute and {request.memory_mib} MiB "
            f"(largest: {biggest.name}, {biggest.sm_count * 100 // total_sm} %, {biggest.memory_mib} MiB)"
        )
    for profile in candidates:
        starts = feasible_starts(profile, occupied, compute_slices)
        if not starts:
            continue
        start, size = _keeps_most_room(profiles, occupied, profile, starts, compute_slices)
        return MigChoice(profile=profile, start=start, size=size)
    names = ", ".join(p.name for p in candidates)
    raise exhausted(f"no free placement on the card for any profile that covers the request ({names})")


def place_profile(
    profiles: Sequence[MigProfile], occupied: Sequence[Occupied], profile_ref: str, start: int | None
) -> MigChoice:
    """The placement a caller named: ``profile_ref`` (a profile name or id) at ``start``, or, without a start, the
    free placement of that profile that keeps most room. INVALID when the card has no such profile or the profile
    cannot start there; PRECONDITION when that placement is not free now."""
    profile = next((p for p in profiles if profile_ref in (p.name, str(p.profile_id))), None)
    if profile is None:
        known = ", ".join(f"{p.name} (id {p.profile_id})" for p in profiles) or "none"
        raise invalid(f"mig_profile: this card has no GPU-instance profile {profile_ref!r}; it has {known}")
    compute_slices = card_compute_slices(profiles)
    free = feasible_starts(profile, occupied, compute_slices)
    if start is None:
        if not free:
            raise exhausted(f"no free placement for {profile.name} on the card now")
        start, size = _keeps_most_room(profiles, occupied, profile, free, compute_slices)
        return MigChoice(profile=profile, start=start, size=size)
    legal = dict(profile.placements)
    if start not in legal:
        starts = ", ".join(str(s) for s, _ in profile.placements)
        raise invalid(f"mig_placement_start: {profile.name} cannot start at {start} (legal starts: {starts})")
    size = legal[start]
    if (start, size) not in free:
        why = _why_not(profile, start, size, occupied, compute_slices)
        raise precondition(f"{profile.name} at placement {start}: {why}")
    return MigChoice(profile=profile, start=start, size=size)


def _why_not(profile: MigProfile, start: int, size: int, occupied: Sequence[Occupied], compute_slices: int) -> str:
    wanted = set(range(start, start + size))
    for o in occupied:
        if wanted.intersection(o.slices):
            return f"memory slices {o.start}-{o.start + o.size - 1} are held by an instance (profile id {o.profile_id})"
    if sum(1 for o in occupied if o.profile_id == profile.profile_id) >= profile.instance_count:
        return f"the card holds its most instances of {profile.name} ({profile.instance_count})"
    return f"the card's compute slices are taken ({sum(o.compute_slices for o in occupied)} of {compute_slices} used)"


def profile_room(profiles: Sequence[MigProfile], occupied: Sequence[Occupied]) -> tuple[tuple[MigProfile, int], ...]:
    """For each profile: how many more instances of it alone could be created now (lowest free placement first;
    legal placements are aligned, so taking the lowest never blocks a later one that taking another would allow)."""
    compute_slices = card_compute_slices(profiles)
    out = []
    for profile in profiles:
        taken = list(occupied)
        while starts := feasible_starts(profile, taken, compute_slices):
            start, size = min(starts)
            taken.append(Occupied(profile.profile_id, start, size, profile.slice_count))
        out.append((profile, len(taken) - len(occupied)))
    return tuple(out)


CardOrder = Callable[[Sequence[tuple[int, Quota]], Quota], list[int]]


def pick_card(candidates: Sequence[tuple[int, Quota]], request: Quota) -> list[int]:
    """Order cards for an "any" request: most free capacity first (free compute, then free memory).

    ``candidates`` holds (gpu index, free quota). ``topology_aware`` wraps this with the node's topology.
    """
    del request  # free capacity alone decides here
    ranked = sorted(candidates, key=lambda c: (-c[1].compute_percent, -c[1].memory_mib, c[0]))
    return [gpu for gpu, _ in ranked]


def topology_aware(first_choice: Callable[[Sequence[int]], int | None]) -> CardOrder:
    """An "any" order that asks the topology which card to take first among those the request fits on.

    ``first_choice(fitting)`` returns the card whose use costs the node least (Topology.PreferredAllocation with
    count 1: near an RDMA NIC, leaving the best-connected sets of the other cards intact), or None when no
    topology is known yet. The other cards follow in free-capacity order, so a card that turns out full is skipped.
    """

    def order(candidates: Sequence[tuple[int, Quota]], request: Quota) -> list[int]:
        ranked = pick_card(candidates, request)
        free = dict(candidates)
        fitting = [
            g
            for g in ranked
            if free[g].compute_percent >= request.compute_percent and free[g].memory_mib >= request.memory_mib
        ]  # fmt: skip  (compute 0: no limit, admitted as 0 %)
        best = first_choice(fitting) if fitting else None
        return ranked if best is None else [best, *(g for g in ranked if g != best)]

    return order


__all__ = [
    "MigChoice",
    "Occupied",
    "PartitionError",
    "Quota",
    "admit_tdm",
    "choose_mig",
    "covers",
    "feasible_starts",
    "occupied",
    "pick_card",
    "place_profile",
    "profile_room",
    "topology_aware",
]
