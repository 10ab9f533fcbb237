"""One answer to "is this node OK?": what /healthz, systemd's STATUS, the status page and gRPC health all say.

The daemon is *serving* while it has fresh data from the driver library: a hung, lost or failing card is data
about the node (the card is named, and the faults pipeline reacts to it), not a reason to restart the daemon.
It is *down* before the first sample, while the driver library cannot be opened and when samples have stopped
coming. Anything short of that is *degraded*: a card that is not answering, a driver lane stuck in a call, work
piling up (the fault hook's outbox, the journal's queue), a worker thread that failed and was restarted recently
(exporter/supervision.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.backends.lanes import HungCall
from exporter.snapshot import GpuSnapshot, Snapshot


class Level(enum.StrEnum):
    STARTING = "starting"
    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"


class CardState(enum.StrEnum):
    OK = "ok"
    HUNG = "hung"  # a driver call on it passed its deadline and has not returned
    LOST = "lost"  # the driver says the card is gone (fallen off the bus)
    FAILING = "failing"  # its calls fail (reset required, driver errors)
    STALE = "stale"  # its last good sample is too old
    UNKNOWN = "unknown"  # never answered yet


@dataclass(frozen=True, slots=True)
class CardStatus:
    index: int
    uuid: str
    state: CardState
    detail: str = ""


def _no_backlog() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeStatus:
    level: Level
    summary: str  # one line, for a person
    cards: tuple[CardStatus, ...] = ()
    stuck: tuple[str, ...] = ()  # hung driver lanes that are not a card (events, node-wide calls)
    backlogs: Mapping[str, int] = field(default_factory=_no_backlog)
    failed_workers: tuple[str, ...] = ()  # supervised threads that failed recently, each described in one line

    @property
    def serving(self) -> bool:
        return self.level in (Level.OK, Level.DEGRADED)

    def cards_in(self, *states: CardState) -> list[int]:
        return [c.index for c in self.cards if c.state in states]


def stale_after(interval: float, read_deadline: float, open_deadline: float) -> float:
    """How old the last Snapshot may be before the daemon counts as down (and the watchdog stops pinging).

    A healthy cycle takes at most two read deadlines (a card that just hung), a backend (re)open at most the open
    deadline, and three intervals leave room for a busy machine."""
    return 3 * interval + 2 * read_deadline + open_deadline


def card_status(
    gpu: GpuSnapshot, hung: HungCall | None, now: float, mono_now: float, stale_seconds: float
) -> CardStatus:
    if hung is not None:
        return CardStatus(gpu.index, gpu.uuid, CardState.HUNG, f"{hung.call} stuck for {mono_now - hung.since:.0f}s")
    if not gpu.fresh:
        if gpu.error_code == "gpu_lost":
            return CardStatus(gpu.index, gpu.uuid, CardState.LOST, gpu.error or "")
        if gpu.error_code == "timeout":
            return CardStatus(gpu.index, gpu.uuid, CardState.HUNG, gpu.error or "")
        if gpu.sample is None and gpu.info is None:
            return CardStatus(gpu.index, gpu.uuid, CardState.UNKNOWN, gpu.error or "")
        return CardStatus(gpu.index, gpu.uuid, CardState.FAILING, gpu.error or "")
    if gpu.sampled_at is not None and now - gpu.sampled_at > stale_seconds:
        return CardStatus(gpu.index, gpu.uuid, CardState.STALE, f"last sample {now - gpu.sampled_at:.0f}s ago")
    return CardStatus(gpu.index, gpu.uuid, CardState.OK)


def summarize(
    snapshot: Snapshot | None,
    *,
    now: float,
    mono_now: float,
    stale_seconds: float,
    hung: Sequence[HungCall] = (),
    backlogs: Mapping[str, int] | None = None,
    failed_workers: Sequence[str] = (),
) -> NodeStatus:
    """``now`` is wall-clock (Snapshot times), ``mono_now`` monotonic (HungCall times)."""
    backlog = MappingProxyType({k: v for k, v in (backlogs or {}).items() if v > 0})
    if snapshot is None:
        return NodeStatus(Level.STARTING, "waiting for the first sample", backlogs=backlog)
    if not snapshot.backend_up:
        text = f"GPU backend {snapshot.backend_name} down: {snapshot.backend_error}"
        return NodeStatus(Level.DOWN, text, backlogs=backlog)
    age = max(0.0, now - snapshot.taken_at)
    if age > stale_seconds:
        text = f"samples are stale: last one {age:.0f}s ago (limit {stale_seconds:.0f}s)"
        return NodeStatus(Level.DOWN, text, backlogs=backlog)
    by_card = {h.scope: h for h in hung if isinstance(h.scope, int)}
    stuck = tuple(h.describe(mono_now) for h in hung if not isinstance(h.scope, int))
    cards = tuple(card_status(g, by_card.get(g.index), now, mono_now, stale_seconds) for g in snapshot.gpus)
    problems = [c for c in cards if c.state is not CardState.OK]
    text = f"{len(cards)} GPUs ({snapshot.backend_name}), last sample {age:.1f}s ago"
    for state in (CardState.HUNG, CardState.LOST, CardState.FAILING, CardState.STALE, CardState.UNKNOWN):
        named = [c for c in problems if c.state is state]
        if named:
            text += f"; {state.value}: " + ", ".join(
                f"GPU {c.index}" + (f" ({_short(c.detail)})" if c.detail else "") for c in named
            )
    if stuck:
        text += "; stuck: " + ", ".join(stuck)
    if backlog:
        text += "; backlog: " + ", ".join(f"{k} {v}" for k, v in sorted(backlog.items()))
    workers = tuple(failed_workers)
    if workers:
        text += "; workers failed: " + ", ".join(workers)
    level = Level.DEGRADED if problems or stuck or backlog or workers else Level.OK
    return NodeStatus(level, text, cards, stuck, backlog, workers)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
