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
facades over it are in ``guarded.py``.

A 64-card sampling cycle hands about 200 calls to the lanes, so a call is kept light: its state lives on the job,
under its lane's one lock (no Future per call; one is made only for an async waiter or a reader of ``outcome``),
and a thread is woken only when it waits (the lane's thread for work, a caller for an answer).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

import structlog

from exporter.backends.call_counters import CallCounters, Counters
from exporter.backends.errors import BackendError
from exporter.backends.protocol import Backend

T = TypeVar("T")
log = structlog.get_logger("device")

NODE = "node"  # lane of node-wide calls: open, close, system_info, device_count
EVENTS = "events"  # lane of the driver's event wait (it blocks by design, so it gets its own)
Scope = int | str  # a card index, NODE or EVENTS


class Deadlines(Protocol):
    """How long a call may take before its card is considered hung: the ``[sampler]`` settings
    (``exporter/sampler.py``) in the daemon, any object with these three in a test."""

    @property
    def call_deadline_seconds(self) -> float: ...  # reads: sample, processes, device_info, MIG listings, NVLink peers

    @property
    def change_deadline_seconds(self) -> float: ...  # MIG instance create/destroy (the driver reconfigures the card)

    @property
    def open_deadline_seconds(self) -> float: ...  # nvmlInit and friends


class CallTimeoutError(BackendError):
    """The call passed its deadline. It may still be running in the driver; its lane is marked hung."""

    def __init__(self, message: str, *, call: str, scope: Scope) -> None:
        super().__init__(message, call=call, code="timeout")
        self.scope = scope


class CardHungError(BackendError):
    """The lane is stuck in an earlier call: this one was not attempted (it would only have queued behind it)."""

    def __init__(self, message: str, *, call: str, scope: Scope, stuck_call: str, stuck_seconds: float) -> None:
        super().__init__(message, call=call, code="hung")
        self.scope = scope
        self.stuck_call = stuck_call
        self.stuck_seconds = stuck_seconds


@dataclass(frozen=True, slots=True)
class HungCall:
    """A call past its deadline that has not returned yet."""

    scope: Scope
    call: str
    since: float  # monotonic time the call started
    deadline_seconds: float

    def describe(self, now: float) -> str:
        where = f"GPU {self.scope}" if isinstance(self.scope, int) else f"the {self.scope} lane"
        return f"{where}: {self.call} has not returned after {now - self.since:.0f}s"


_LATE_KEPT = 64  # late answers kept per call name: one stuck call returns one; a bound all the same


def scope_name(scope: Scope) -> str:
    return f"GPU {scope}" if isinstance(scope, int) else f"driver ({scope} calls)"


class _Job:
    """One call on a lane. Its fields change only under the lane's lock; a call costs no Future: the two answers
    below are kept here, and a Future of either is made only for an async waiter or a reader of ``outcome``."""

    __slots__ = (
        "answer",
        "answer_error",
        "answered",
        "call",
        "deadline",
        "done",
        "error",
        "fn",
        "future",
        "keep_late",
        "outcome",
        "started",
        "submitted",
        "value",
    )

    def __init__(self, call: str, fn: Callable[[], Any], deadline: float, submitted: float, keep_late: bool) -> None:
        self.call = call
        self.fn = fn
        self.deadline = deadline
        self.submitted = submitted
        self.keep_late = keep_late  # an answer after the caller gave up goes to the next call of this name
        self.started: float | None = None
        # what the caller sees (may be a timeout)
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        # what the driver answered, whenever it does (or the error of a call that never ran)
        self.answered = False
        self.answer: Any = None
        self.answer_error: BaseException | None = None
        self.future: Future[Any] | None = None  # the caller's answer, for an async waiter
        self.outcome: Future[Any] | None = None  # the driver's answer, for ``Pending.outcome``


def _complete(future: Future[Any], value: Any, error: BaseException | None) -> None:
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _future(known: bool, value: Any, error: BaseException | None) -> Future[Any]:
    """A Future of one of a job's two answers, made when first asked for: complete already if the answer is known."""
    future: Future[Any] = Future()
    if known:
        _complete(future, value, error)
    return future


class Lane:
    """One thread that runs the driver calls of one scope, in order, and knows when it is stuck."""

    def __init__(self, scope: Scope, counters: Counters, monotonic: Callable[[], float]) -> None:
        self.scope = scope
        self._counters = counters
        self._monotonic = monotonic
        self._lock = threading.RLock()
        self._work = threading.Condition(self._lock)  # the lane's thread waits here for a call
        self._answered = threading.Condition(self._lock)  # callers wait here for their call's answer
        self._idle = False  # the lane's thread is waiting in _work
        self._waiting = 0  # callers waiting in _answered
        self._queue: deque[_Job] = deque()
        self._current: _Job | None = None
        self._hung: HungCall | None = None
        self._closed = False
        self._late: dict[str, deque[Any]] = {}  # call -> answers that came back after their caller gave up
        self._thread = threading.Thread(target=self._run, name=f"lane-{scope}", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------------------------------

    def submit(self, call: str, fn: Callable[[], Any], deadline: float, *, keep_late: bool = False) -> _Job:
        job = _Job(call, fn, deadline, self._monotonic(), keep_late)
        with self._lock:
            late = self._late.get(call)
            if keep_late and late:
                answer = late.popleft()  # a late answer is the next caller's, before anything new is asked
                if not late:
                    del self._late[call]
                self._settle(job, answer, None)
                self._answer(job, answer, None)
                return job
            self._expire_locked(job.submitted)
            if self._hung is not None:
                error = self._hung_error(call, job.submitted)
                self._counters.error(call, error.code)
                self._fail(job, error)
                return job
            if self._closed:
                self._fail(job, BackendError(f"{scope_name(self.scope)}: shutting down", call=call))
                return job
            self._queue.append(job)
            if self._idle:
                self._work.notify()
        return job

    def result(self, job: _Job) -> Any:
        """Wait for ``job`` on this thread, at most until its wait runs out (then the lane decides, as ``expire``)."""
        with self._lock:
            while not job.done:
                expiry = self._expiry_locked(job)
                assert expiry is not None
                now = self._monotonic()
                left = expiry - now
                if left > 0:
                    self._waiting += 1
                    try:
                        self._answered.wait(left)
                    finally:
                        self._waiting -= 1
                else:
                    self._expire_job_locked(job, now)
            value, error = job.value, job.error
        if error is not None:
            raise error
        return value

    def future(self, job: _Job) -> Future[Any]:
        """The caller's answer of ``job`` as a Future (made on first use), for an async waiter."""
        with self._lock:
            if job.future is None:
                job.future = _future(job.done, job.value, job.error)
            return job.future

    def outcome(self, job: _Job) -> Future[Any]:
        """The driver's answer of ``job`` as a Future (made on first use): see ``Pending.outcome``."""
        with self._lock:
            if job.outcome is None:
                job.outcome = _future(job.answered, job.answer, job.answer_error)
            return job.outcome

    def expiry(self, job: _Job) -> float | None:
        """When the wait for ``job`` runs out (monotonic), or None once it is done."""
        with self._lock:
            return self._expiry_locked(job)

    def expire(self, job: _Job, now: float) -> None:
        """Called by a waiter whose wait ran out: mark the lane hung and fail what cannot finish in time."""
        with self._lock:
            self._expire_job_locked(job, now)

    def hung(self) -> HungCall | None:
        with self._lock:
            self._expire_locked(self._monotonic())
            return self._hung

    def close(self) -> None:
        """No new calls; queued ones fail. A call in the driver is left to return (or not) on its own."""
        with self._lock:
            self._closed = True
            while self._queue:
                job = self._queue.popleft()
                self._fail(job, BackendError(f"{scope_name(self.scope)}: shutting down", call=job.call))
            self._work.notify_all()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- internals (hold self._lock) -----------------------------------------------------------------------------

    def _settle(self, job: _Job, value: Any, error: BaseException | None) -> None:
        """The caller's answer (once): the driver's, a timeout, or why the call never ran."""
        job.done, job.value, job.error = True, value, error
        if job.future is not None:
            _complete(job.future, value, error)
        if self._waiting:
            self._answered.notify_all()

    def _answer(self, job: _Job, value: Any, error: BaseException | None) -> None:
        """The driver's answer (once), or the error of a call that never ran."""
        job.answered, job.answer, job.answer_error = True, value, error
        if job.outcome is not None:
            _complete(job.outcome, value, error)

    def _fail(self, job: _Job, error: BaseException) -> None:
        """A job that never ran: its caller and anyone waiting for the driver's answer get the same error."""
        self._settle(job, None, error)
        self._answer(job, None, error)

    def _expire_job_locked(self, job: _Job, now: float) -> None:
        self._expire_locked(now)
        if job.done:
            return
        if job is self._current:
            return  # still running and not yet past its own deadline (the waiter woke early)
        expiry = self._expiry_locked(job)
        if job.started is None and expiry is not None and now >= expiry:
            # queued behind a slow call that is not (yet) past its deadline: give up on this one only
            self._queue.remove(job)
            running = self._current.call if self._current else "?"
            error = CallTimeoutError(
                f"{scope_name(self.scope)}: {job.call} waited {now - job.submitted:.1f}s behind {running}",
                call=job.call,
                scope=self.scope,
            )
            self._counters.timeout(job.call)
            self._fail(job, error)

    def _expiry_locked(self, job: _Job) -> float | None:
        if job.done:
            return None
        if job.started is not None:
            return job.started + job.deadline
        current = self._current
        if current is not None and current.started is not None:
            # queued behind a running call: decided when that one passes its deadline (or returns); the running
            # call may have started after this one was queued, so the waiter asks again rather than give up early
            return max(current.started + current.deadline, job.submitted + job.deadline)
        return job.submitted + job.deadline

    def _expire_locked(self, now: float) -> None:
        current = self._current
        if current is None or current.started is None or self._hung is not None:
            return
        if now - current.started < current.deadline:
            return
        self._hung = HungCall(self.scope, current.call, current.started, current.deadline)
        self._counters.timeout(current.call)
        log.warning(
            "driver call exceeded its deadline; failing fast on this lane until it returns",
            lane=str(self.scope),
            call=current.call,
            deadline_seconds=current.deadline,
        )
        if not current.done:
            self._settle(
                current,
                None,
                CallTimeoutError(
                    f"{scope_name(self.scope)}: {current.call} did not answer within {current.deadline:g}s",
                    call=current.call,
                    scope=self.scope,
                ),
            )
        while self._queue:
            job = self._queue.popleft()
            error = self._hung_error(job.call, now)
            self._counters.error(job.call, error.code)
            self._fail(job, error)

    def _hung_error(self, call: str, now: float) -> CardHungError:
        hung = self._hung
        assert hung is not None
        return CardHungError(
            f"{scope_name(self.scope)} is not answering: {hung.call} has been stuck for {now - hung.since:.0f}s",
            call=call,
            scope=self.scope,
            stuck_call=hung.call,
            stuck_seconds=now - hung.since,
        )

    # -- the lane's thread -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._idle = True
                    try:
                        self._work.wait()
                    finally:
                        self._idle = False
                if not self._queue:
                    return
                job = self._queue.popleft()
                if job.future is not None and not job.future.set_running_or_notify_cancel():
                    job.done, job.error = True, CancelledError()  # its async waiter's future was cancelled
                    continue
                job.started = self._monotonic()
                self._current = job
            self._counters.call(job.call)
            try:
                result = job.fn()
            except BaseException as exc:  # handed to the caller, whatever it is
                self._finish(job, None, exc)
            else:
                self._finish(job, result, None)

    def _finish(self, job: _Job, result: Any, exc: BaseException | None) -> None:
        now = self._monotonic()
        with self._lock:
            self._current = None
            hung, self._hung = self._hung, None
            if exc is not None:
                code = exc.code if isinstance(exc, BackendError) else "internal"
                self._counters.error(job.call, code)
            late = job.done  # its caller already got a timeout
            if not late:
                self._settle(job, result, exc)
            self._answer(job, result, exc)
            if late and job.keep_late and exc is None and result is not None:
                self._late.setdefault(job.call, deque(maxlen=_LATE_KEPT)).append(result)
        if hung is not None:
            log.info(
                "driver call returned after its deadline; lane answering again",
                lane=str(self.scope),
                call=job.call,
                seconds=round(now - hung.since, 3),
            )


class DeviceAccess:
    """The lanes of one backend, with their counters."""

    def __init__(
        self,
        backend: Backend,
        deadlines: Deadlines,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.deadlines = deadlines
        self._monotonic = monotonic
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
                lane = self._lanes[scope] = Lane(scope, self._counters, self._monotonic)
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

    def __init__(self, lane: Lane, job: _Job, monotonic: Callable[[], float]) -> None:
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
    "Lane",
    "Pending",
    "Scope",
    "scope_name",
]
