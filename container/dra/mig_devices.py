"""MIG cards as partitionable devices (KEP-4815, resource.k8s.io/v1 ``sharedCounters``/``consumesCounters``).

One counter set per card: ``memory-slice-<i>`` (value 1) for each of the card's memory slices, ``compute-slices``
for its compute slices, and ``<profile>-instances`` for a profile the card allows fewer instances of than its
placements could hold (the media-extension profiles, ``1g.18gb+me``: one per card). Every (profile, placement) is
a device that consumes the memory slices it covers, its compute slices and its instance counter, so the scheduler
never allocates two overlapping instances. Placements that overlap an instance the driver does not own (one an
operator made, or one of another front end) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubernetes.client import models as k

from container.dra import names
from container.dra.quantity import bytes_quantity

_GI_PROFILE = re.compile(r"^(\d+)g\.")  # NVIDIA GPU-instance profile names: <compute slices>g.<memory>gb[+ext]
COMPUTE_SLICES = "compute-slices"


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile of a card: the daemon's MigProfileRoom and its legal placements."""

    name: str
    profile_id: int
    memory_bytes: int
    sm_count: int
    instance_count: int
    placements: tuple[tuple[int, int], ...]  # (first memory slice, memory slices)

    @property
    def compute_slices(self) -> int:
        match = _GI_PROFILE.match(self.name)
        return int(match.group(1)) if match else 0

    @property
    def slug(self) -> str:
        return profile_slug(self.name)

    @property
    def instance_counter(self) -> str:
        return f"{self.slug}-instances"

    def needs_instance_counter(self) -> bool:
        return self.instance_count < _most_disjoint(self.placements)


def profile_slug(name: str) -> str:
    """A profile name as a DNS label: 1g.18gb+me -> 1g-18gb-me."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _most_disjoint(placements: Iterable[tuple[int, int]]) -> int:
    """The most placements that can be held at once (interval scheduling, earliest end first)."""
    count, end = 0, -1
    for start, size in sorted(placements, key=lambda p: p[0] + p[1]):
        if start >= end:
            count, end = count + 1, start + size
    return count


def _overlaps(start: int, size: int, taken: Sequence[tuple[int, int]]) -> bool:
    return any(start < t_start + t_size and t_start < start + size for t_start, t_size in taken)


def counter_set_name(gpu: int) -> str:
    return f"gpu-{gpu}-mig"


def device_name(gpu: int, profile: Profile, start: int) -> str:
    return f"gpu-{gpu}-mig-{profile.slug}-{start}"


def usable(profiles: Sequence[Profile]) -> list[Profile]:
    """Profiles the model can express: a GPU-instance name and at least one known placement."""
    return [p for p in profiles if p.compute_slices > 0 and p.placements]


def counter_set(gpu: int, memory_slices: int, profiles: Sequence[Profile]) -> k.V1CounterSet:
    counters = {f"memory-slice-{i}": k.V1Counter(value="1") for i in range(memory_slices)}
    counters[COMPUTE_SLICES] = k.V1Counter(value=str(max(p.compute_slices for p in profiles)))
    for p in profiles:
        if p.needs_instance_counter():
            counters[p.instance_counter] = k.V1Counter(value=str(p.instance_count))
    return k.V1CounterSet(name=counter_set_name(gpu), counters=counters)


def devices(
    gpu: int,
    card_attributes: Mapping[str, k.V1DeviceAttribute],
    profiles: Sequence[Profile],
    *,
    memory_slices: int,
    taken: Sequence[tuple[int, int]],
    taints: list[k.V1DeviceTaint] | None,
) -> list[k.V1Device]:
    """Every free (profile, placement) of one MIG card."""
    out = []
    for profile in profiles:
        for start, size in profile.placements:
            if start + size > memory_slices or _overlaps(start, size, taken):
                continue
            consumed = {f"memory-slice-{i}": k.V1Counter(value="1") for i in range(start, start + size)}
            consumed[COMPUTE_SLICES] = k.V1Counter(value=str(profile.compute_slices))
            if profile.needs_instance_counter():
                consumed[profile.instance_counter] = k.V1Counter(value="1")
            attributes = dict(card_attributes)
            attributes.update(
                {
                    names.MODE: k.V1DeviceAttribute(string="mig"),
                    names.MIG_PROFILE: k.V1DeviceAttribute(string=profile.name),
                    names.MIG_PROFILE_ID: k.V1DeviceAttribute(int=profile.profile_id),
                    names.PLACEMENT_START: k.V1DeviceAttribute(int=start),
                    names.PLACEMENT_SIZE: k.V1DeviceAttribute(int=size),
                }
            )
            out.append(
                k.V1Device(
                    name=device_name(gpu, profile, start),
                    attributes=attributes,
                    capacity={
                        names.MEMORY: k.V1DeviceCapacity(value=bytes_quantity(profile.memory_bytes)),
                        names.MULTIPROCESSORS: k.V1DeviceCapacity(value=str(profile.sm_count)),
                    },
                    consumes_counters=[
                        k.V1DeviceCounterConsumption(counter_set=counter_set_name(gpu), counters=consumed)
                    ],
                    taints=taints,
                )
            )
    return out
