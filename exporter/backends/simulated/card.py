"""The state of one simulated card and the model that moves its values.

A card's load is the sum of its processes' loads, wobbling slowly when the scenario is dynamic; utilization,
power, energy, clocks, temperatures and NVLink traffic follow it. Every field of :class:`Card` is guarded by its
``lock``; a hang injected on the card is an event in ``hangs`` that calls wait on outside the lock.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import exporter.backends.simulated.profiling as profiling_model
from exporter.backends.scenario import Scenario
from exporter.backends.types import ComputeMode, LinkState, MigProfile


@dataclass
class Link:
    state: LinkState = LinkState.UP
    crc: int = 0
    replay: int = 0
    recovery: int = 0
    tx: float = 0.0
    rx: float = 0.0


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Simulation only: the Kubernetes pod a simulated process runs in (read by the simulated node's proc tree)."""

    namespace: str
    pod: str
    container: str


@dataclass
class Proc:
    pid: int
    name: str
    memory_bytes: int
    load: float
    gpu_instance_id: int | None
    pod: PodPlacement | None = None


@dataclass(frozen=True, slots=True)
class SimulatedWorkload:
    """Simulation only: one simulated GPU process and where it lives, for the simulated proc tree and kubelet."""

    gpu: int
    uuid: str
    pid: int
    name: str
    gpu_instance_id: int | None
    mig_uuid: str | None
    pod: PodPlacement | None


@dataclass
class MigGi:
    """A simulated GPU instance; each has one compute instance (id 0) spanning it."""

    gpu_instance_id: int
    profile: MigProfile
    start: int
    uuid: str


@dataclass
class Card:
    """Mutable state of one simulated card, guarded by ``lock``."""

    index: int
    uuid: str
    pci_bus_id: str
    serial: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    procs: dict[int, Proc] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    orphan_memory: int = 0
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    ecc_pending: bool = True
    remap_cor: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    recovery_action: int = 0
    pcie_replay: int = 0
    compute_mode: ComputeMode = ComputeMode.DEFAULT
    persistence: bool = True
    mig_current: bool = False
    mig_pending: bool = False
    mig: dict[int, MigGi] = field(default_factory=dict)
    lost: bool = False
    process_list_denied: bool = False  # as an unprivileged caller: NVML refuses the parent's list with MIG on
    hangs: dict[str, threading.Event] = field(default_factory=dict)
    energy: float = 0.0
    last_t: float | None = None
    gpm: profiling_model.Brackets = field(default_factory=profiling_model.Brackets)
    phase: float = 0.0


def new_card(scenario: Scenario, index: int) -> Card:
    """Card ``index`` of the scenario as it starts: links up, energy counter offset per card, MIG as configured."""
    spec = scenario.cards[index]
    card = Card(index=index, uuid=spec.uuid, pci_bus_id=spec.pci_bus_id, serial=spec.serial)
    card.links = [Link() for _ in range(scenario.nvlink_count)]
    card.energy = scenario.energy_joules_at_start + 1000.0 * index
    card.mig_current = card.mig_pending = spec.mig_enabled
    card.phase = (index * 0.7) % (2 * math.pi)
    return card


def wobble(scenario: Scenario, card: Card, now: float) -> float:
    """A slow swing of 0.8-1.0 around the processes' demand (none when the scenario replays the capture as is)."""
    if not scenario.dynamic:
        return 1.0
    return 0.9 + 0.1 * math.sin(2 * math.pi * now / 97.0 + card.phase)


def load(scenario: Scenario, card: Card, now: float) -> float:
    """The share of time the card is busy, 0-1 (hold ``card.lock``)."""
    demand = sum(p.load for p in card.procs.values())
    return max(0.0, min(1.0, demand * wobble(scenario, card, now)))


def instance_load(scenario: Scenario, card: Card, gpu_instance_id: int, now: float) -> float:
    """The busy share of one GPU instance, driven by its own processes (hold ``card.lock``)."""
    demand = sum(p.load for p in card.procs.values() if p.gpu_instance_id == gpu_instance_id)
    return max(0.0, min(1.0, demand * wobble(scenario, card, now)))


def memory_used(card: Card) -> int:
    return card.orphan_memory + sum(p.memory_bytes for p in card.procs.values())


def power_watts(scenario: Scenario, busy: float) -> float:
    """Board power: idle power plus a share of 92% of the limit that follows the load."""
    return scenario.idle_power_watts + (scenario.power_limit_watts * 0.92 - scenario.idle_power_watts) * busy


def advance_counters(scenario: Scenario, card: Card, now: float, busy: float) -> None:
    """Move energy and NVLink byte counters on to ``now`` at the given load (hold ``card.lock``)."""
    if card.last_t is None or now <= card.last_t:
        card.last_t = now if card.last_t is None else card.last_t
        return
    dt = now - card.last_t
    card.last_t = now
    card.energy += power_watts(scenario, busy) * dt
    per_link = profiling_model.NVLINK_BYTES_PER_SECOND_BUSY * busy / max(1, len(card.links)) * dt
    for link in card.links:
        if link.state is LinkState.UP:
            link.tx += per_link
            link.rx += per_link


__all__ = [
    "Card",
    "Link",
    "MigGi",
    "PodPlacement",
    "Proc",
    "SimulatedWorkload",
    "advance_counters",
    "instance_load",
    "load",
    "memory_used",
    "new_card",
    "power_watts",
    "wobble",
]
