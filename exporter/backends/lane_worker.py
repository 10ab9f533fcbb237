"""One lane: the thread that runs the driver calls of one scope (a card, node-wide calls or the event wait) in order,
and how it fails a call: :class:`CallTimeoutError` for the call past its deadline (the lane is then hung, a
:class:`HungCall`), :class:`CardHungError` for every call behind it until it returns. ``lanes.py`` says what a lane
guarantees; :class:`~exporter.backends.lanes.DeviceAccess` there owns the lanes and is the way in.

A 64-card sampling cycle hands about 200 calls to the lanes, so a call is kept light: its state lives on its
:class:`Job`, under its lane's one lock (no Future per call; one is made only for an async waiter or a reader of
``outcome``), and a thread is woken only when it waits (the lane's thread for work, a caller for an answer).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from exporter.backends.call_counters import Counters
from exporter.backends.errors import BackendError

log = structlog.get_logger("device")

Scope = int | str  # a card index, NODE or EVENTS (lanes.py)


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


class Job:
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


class GiveWay(Protocol):
    """What a lane steps aside for before it takes a call (the daemon's requests in flight, exporter/inflight.py)."""

    @property
    def busy(self) -> bool: ...  # an attribute read: asked before every call

    def give_way(self) -> None: ...  # called while busy: waits a little, without the GIL, and returns


class Lane:
    """One thread that runs the driver calls of one scope, in order, and knows when it is stuck."""

    def __init__(
        self,
        scope: Scope,
        counters: Counters,
        monotonic: Callable[[], float],
        give_way: GiveWay | None = None,
    ) -> None:
        self.scope = scope
        self._counters = counters
        self._monotonic = monotonic
        self._give_way = give_way  # called before each call is taken (it may wait a little: see lanes.py)
        self._lock = threading.RLock()
        self._work = threading.Condition(self._lock)  # the lane's thread waits here for a call
        self._answered = threading.Condition(self._lock)  # callers wait here for their call's answer
        self._idle = False  # the lane's thread is waiting in _work
        self._waiting = 0  # callers waiting in _answered
        self._queue: deque[Job] = deque()
        self._current: Job | None = None
        self._hung: HungCall | None = None
        self._closed = False
        self._late: dict[str, deque[Any]] = {}  # call -> answers that came back after their caller gave up
        self._thread = threading.Thread(target=self._run, name=f"lane-{scope}", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------------------------------

    def submit(self, call: str, fn: Callable[[], Any], deadline: float, *, keep_late: bool = False) -> Job:
        job = Job(call, fn, deadline, self._monotonic(), keep_late)
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

    def result(self, job: Job) -> Any:
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

    def future(self, job: Job) -> Future[Any]:
        """The caller's answer of ``job`` as a Future (made on first use), for an async waiter."""
        with self._lock:
            if job.future is None:
                job.future = _future(job.done, job.value, job.error)
            return job.future

    def outcome(self, job: Job) -> Future[Any]:
        """The driver's answer of ``job`` as a Future (made on first use): see ``Pending.outcome``."""
        with self._lock:
            if job.outcome is None:
                job.outcome = _future(job.answered, job.answer, job.answer_error)
            return job.outcome

    def expiry(self, job: Job) -> float | None:
        """When the wait for ``job`` runs out (monotonic), or None once it is done."""
        with self._lock:
            return self._expiry_locked(job)

    def expire(self, job: Job, now: float) -> None:
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

    def _settle(self, job: Job, value: Any, error: BaseException | None) -> None:
        """The caller's answer (once): the driver's, a timeout, or why the call never ran."""
        job.done, job.value, job.error = True, value, error
        if job.future is not None:
            _complete(job.future, value, error)
        if self._waiting:
            self._answered.notify_all()

    def _answer(self, job: Job, value: Any, error: BaseException | None) -> None:
        """The driver's answer (once), or the error of a call that never ran."""
        job.answered, job.answer, job.answer_error = True, value, error
        if job.outcome is not None:
            _complete(job.outcome, value, error)

    def _fail(self, job: Job, error: BaseException) -> None:
        """A job that never ran: its caller and anyone waiting for the driver's answer get the same error."""
        self._settle(job, None, error)
        self._answer(job, None, error)

    def _expire_job_locked(self, job: Job, now: float) -> None:
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

    def _expiry_locked(self, job: Job) -> float | None:
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
        give_way, gave_way = self._give_way, False
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._idle, gave_way = True, False  # a call that comes now gives way afresh
                    try:
                        self._work.wait()
                    finally:
                        self._idle = False
                if not self._queue:
                    return
                job = None
                if give_way is None or gave_way or not give_way.busy:
                    gave_way = False
                    job = self._queue.popleft()
                    if job.future is not None and not job.future.set_running_or_notify_cancel():
                        job.done, job.error = True, CancelledError()  # its async waiter's future was cancelled
                        continue
                    job.started = self._monotonic()
                    self._current = job
            if job is None:
                assert give_way is not None
                give_way.give_way()  # outside the lock, the call still queued: its wait runs out as behind any call
                gave_way = True
                continue
            self._counters.call(job.call)
            try:
                result = job.fn()
            except BaseException as exc:  # handed to the caller, whatever it is
                self._finish(job, None, exc)
            else:
                self._finish(job, result, None)

    def _finish(self, job: Job, result: Any, exc: BaseException | None) -> None:
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


__all__ = ["CallTimeoutError", "CardHungError", "GiveWay", "HungCall", "Job", "Lane", "Scope", "scope_name"]
