"""Lanes: the threads that run driver calls, one per card, one for node-wide calls and one for the event wait.

A driver call can block for minutes (an H200 sat in ``nvmlSystemGetTopologyGpuSet`` for more than 100 s, while the
rest of NVML kept answering). So every call runs on a *lane*, and a caller never runs a driver call itself and never
waits past the call's deadline:

- A call that passes its deadline is counted as a timeout once, its caller gets :class:`CallTimeoutError`, and the
  lane is marked hung. Calls queued behind it, and every new call to that lane, fail at once with
  :class:`CardHungError` naming the card and the stuck call, until the stuck call returns; then the lane is
  healthy again by itself.
- A hung card therefore costs exactly its own lane's thread, however long it stays hung and however many
  callers try it: no thread is started per call, and no shared pool ever waits on the driver.
- A call whose answer is data that must not be lost (the driver's event wait: the event it returns late is often
  the XID 79 of the card that stalled it) is submitted with ``keep_late=True``: an answer that comes back after
  its caller gave up is kept on the lane and is the answer of the next call of the same name, which then does not
  reach the driver. Other calls are reads that the next caller repeats anyway; their late answers only reach
  ``Pending.outcome`` (a late MIG create is adopted through it).

:class:`DeviceAccess` owns the lanes of one backend and their call counters; :meth:`DeviceAccess.submit` returns a
:class:`Pending` that a thread waits on with ``result()`` and the event loop with ``await wait()``. The Backend
facades over it are in ``guarded.py``; one lane, its thread and its jobs, in ``lane_worker.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Generic, Protocol, TypeVar, cast

from exporter.backends.call_counters import CallCounters, Counters
from exporter.backends.errors import BackendError
from exporter.backends.lane_worker import (  # the errors, HungCall, Scope and scope_name: public here, as before
    CallTimeoutError,
    CardHungError,
    GiveWay,
    HungCall,
    Job,
    Lane,
    Scope,
    scope_name,
)
from exporter.backends.protocol import Backend

T = TypeVar("T")

NODE = "node"  # lane of node-wide calls: open, close, system_info, device_count
EVENTS = "events"  # lane of the driver's event wait (it blocks by design, so it gets its own)


class Deadlines(Protocol):
    """How long a call may take before its card is considered hung: the ``[sampler]`` settings
    (``exporter/sampler.py``) in the daemon, any object with these three in a test."""

    @property
    def call_deadline_seconds(self) -> float: ...  # reads: sample, processes, device_info, MIG listings, NVLink peers

    @property
    def change_deadline_seconds(self) -> float: ...  # MIG instance create/destroy (the driver reconfigures the card)

    @property
    def open_deadline_seconds(self) -> float: ...  # nvmlInit and friends


class DeviceAccess:
    """The lanes of one backend, with their counters."""

    def __init__(
        self,
        backend: Backend,
        deadlines: Deadlines,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        give_way: GiveWay | None = None,
    ) -> None:
        """``give_way``: what a card's lane steps aside for before it takes each call while it is busy (the daemon's
        requests in flight, exporter/inflight.py: a 64-card fan-out wakes 64 lanes at once); its wait must be
        bounded to a few ms."""
        self.backend = backend
        self.deadlines = deadlines
        self._monotonic = monotonic
        self._give_way = give_way
        self._counters = Counters()
        self._lanes: dict[Scope, Lane] = {}
        self._lock = threading.Lock()
        self._closed = False

    def lane(self, scope: Scope) -> Lane:
        lane = self._lanes.get(scope)  # a lane, once made, is the scope's for good: no lock to find it
        if lane is not None:
            return lane
        with self._lock:
            lane = self._lanes.get(scope)
            if lane is None:
                if self._closed:
                    raise BackendError(f"{scope_name(scope)}: shutting down")
                give_way = self._give_way if isinstance(scope, int) else None  # node and event lanes never wait
                lane = self._lanes[scope] = Lane(scope, self._counters, self._monotonic, give_way)
            return lane

    def submit(
        self, scope: Scope, call: str, fn: Callable[[], T], deadline: float, *, keep_late: bool = False
    ) -> Pending[T]:
        """Run ``fn`` on the lane of ``scope``; ``keep_late``: see the module docstring."""
        lane = self.lane(scope)
        return Pending(lane, lane.submit(call, fn, deadline, keep_late=keep_late), self._monotonic)

    def now(self) -> float:
        """The layer's monotonic clock (HungCall.since is on it)."""
        return self._monotonic()

    def hung(self) -> tuple[HungCall, ...]:
        with self._lock:
            lanes = list(self._lanes.values())
        return tuple(h for lane in lanes if (h := lane.hung()) is not None)

    def hung_cards(self) -> Mapping[int, HungCall]:
        return {h.scope: h for h in self.hung() if isinstance(h.scope, int)}

    def counters(self) -> CallCounters:
        return self._counters.freeze()

    def shutdown(self, timeout: float) -> tuple[HungCall, ...]:
        """Close the lanes and give their threads ``timeout`` seconds; returns the calls still in the driver."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.close()
        end = self._monotonic() + timeout
        for lane in lanes:
            lane.join(max(0.0, end - self._monotonic()))
        return tuple(h for lane in lanes if (h := lane.hung()) is not None)


class Pending(Generic[T]):
    """A submitted call: ``result()`` waits for it on a thread, ``wait()`` on the event loop; both obey its deadline."""

    def __init__(self, lane: Lane, job: Job, monotonic: Callable[[], float]) -> None:
        self._lane = lane
        self._job = job
        self._monotonic = monotonic

    @property
    def outcome(self) -> Future[T]:
        """The driver's answer: completes when the call returns, even after its deadline (a late MIG create)."""
        return cast("Future[T]", self._lane.outcome(self._job))

    def result(self) -> T:
        return cast("T", self._lane.result(self._job))

    async def wait(self) -> T:
        job = self._job
        waiter = asyncio.wrap_future(self._lane.future(job))
        waiter.add_done_callback(_consume)
        while True:
            expiry = self._lane.expiry(job)
            if expiry is None:
                return cast("T", await waiter)
            left = expiry - self._monotonic()
            if left > 0:
                done, _ = await asyncio.wait({waiter}, timeout=left)
                if done:
                    return cast("T", waiter.result())
            self._lane.expire(job, self._monotonic())


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark an outcome seen, so a caller that stopped waiting (cancelled) leaves no 'never retrieved' noise."""
    if not future.cancelled():
        future.exception()


__all__ = [
    "EVENTS",
    "NODE",
    "CallTimeoutError",
    "CardHungError",
    "Deadlines",
    "DeviceAccess",
    "HungCall",
    "Pending",
    "Scope",
    "scope_name",
]
