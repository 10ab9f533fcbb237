"""A named executor with one daemon thread, for blocking I/O that must stay off the event loop.

Each kind of slow work gets its own (the fault journal, the partition store, MPS control, the topology collection),
so a slow disk or a stuck helper binary delays only its own kind, never another's, and never the default pool that
asyncio shares.
Its thread is a daemon thread and ``shutdown`` takes a timeout: unlike ``ThreadPoolExecutor``, whose threads the
interpreter joins at exit, a stuck job can never hold up the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class SerialExecutor(Executor):
    """Runs submitted callables one at a time, in order, on one named daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"executor {self.name} is shut down")
            self._queue.append((future, lambda: fn(*args, **kwargs)))
            self._cond.notify()
        return future

    def backlog(self) -> int:
        with self._cond:
            return len(self._queue)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None) -> None:
        """Stop taking work; queued work still runs unless cancelled. ``wait`` waits at most ``timeout``."""
        with self._cond:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._cond.notify()
        if wait:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                future, job = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)


async def in_daemon_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking call on a fresh daemon thread and await it, so an abandoned wait never delays exit.

    For rare, bounded work (stopping components); asyncio's shared default pool is joined at exit, this is not.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the awaiting coroutine
            _call_soon(loop, settle, None, exc)
        else:
            _call_soon(loop, settle, result, None)

    threading.Thread(target=work, name=f"stop-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await done


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(fn, *args)
