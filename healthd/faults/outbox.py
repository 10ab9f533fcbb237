"""Deliver queued faults to the replacement hooks: at-least-once, in sequence order, backoff with jitter.

The outbox rows are written in the same transaction as the record that queued them, so a fault that was
accepted is delivered even if the daemon dies right after. Each target has its own loop and its own order; the
head item blocks the ones behind it until the hook acknowledges it (strict order beats throughput here: the
hook sees the node's faults as they happened). The fault id is the idempotency key.

Waits are measured on the monotonic clock: the time of the next attempt is stored on the wall clock (it survives a
restart), but the dispatcher that set it waits for the back-off it chose, whatever the wall clock does meanwhile. A
retry time read back after a restart is trusted for at most ``backoff_max_seconds``, so a wall clock stepped back
across the restart cannot hold a delivery longer than the longest back-off.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import grpc
import structlog

from exporter.settings import ConfigError
from healthd.faults.convert import fault_report_pb
from healthd.faults.fault import HookDelivery
from healthd.faults.journal import Journal
from healthd.faults.notify import CommitSignal
from healthd.faults.settings import HookSettings, load_hook_tls
from healthd.rpc.transport import hook_channel, is_tcp

if TYPE_CHECKING:
    from healthd.api.v1.hook_pb2_grpc import ReplacementHookAsyncStub

T = TypeVar("T")
P = ParamSpec("P")
log = structlog.get_logger("hook")

IDLE_RECHECK_SECONDS = 60.0


def backoff_delay(attempts: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half the step fixed, half random, so retries never line up."""
    step = min(maximum, initial * (2.0 ** min(attempts, 60)))
    return step / 2 + rng.uniform(0.0, step / 2)


class HookDispatcher:
    def __init__(
        self,
        journal: Journal,
        settings: HookSettings,
        signal: CommitSignal,
        journal_io: Executor,
        *,
        node_name: str,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._journal = journal
        self._s = settings
        self._signal = signal
        self._io = journal_io
        self._node = node_name
        self._clock = clock
        self._monotonic = monotonic
        self._retry_at: dict[str, tuple[int, float]] = {}  # target -> (seq, monotonic time of its next attempt)
        self._rng = rng or random.Random()
        self._tasks: list[asyncio.Task[None]] = []
        self.failures: dict[str, int] = dict.fromkeys(settings.endpoints, 0)
        self.delivered: dict[str, int] = dict.fromkeys(settings.endpoints, 0)
        self.depth: dict[str, int] = dict.fromkeys(settings.endpoints, 0)
        # each fault's delivery state per target, as of the last step of any target's loop (read without I/O)
        self.deliveries: tuple[HookDelivery, ...] = ()

    async def _journal_call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(fn, *args, **kwargs))

    def start(self) -> None:
        for target in self._s.endpoints:
            self._tasks.append(asyncio.create_task(self._run(target), name=f"hook {target}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _channel(self, target: str) -> grpc.aio.Channel:
        """unix: plaintext; HOST:PORT mutual TLS with the [hook] tls_* files (checked at start)."""
        return hook_channel(target, load_hook_tls(self._s) if is_tcp(target) else None)

    def _tls_files(self, target: str) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime, size) of the TLS files a TCP target uses: when they change (a rotated certificate), the
        channel is made again with the new ones, without a daemon restart."""
        if not is_tcp(target):
            return ()
        stamps = []
        for path in (self._s.tls_ca_file, self._s.tls_cert_file, self._s.tls_key_file):
            try:
                st = os.stat(path) if path is not None else None
            except OSError:
                st = None
            stamps.append((str(path), st.st_mtime_ns if st else -1, st.st_size if st else -1))
        return tuple(stamps)

    async def _run(self, target: str) -> None:
        from healthd.api.v1 import hook_pb2_grpc as hpb_grpc

        while True:
            files = self._tls_files(target)
            try:
                channel = self._channel(target)
            except ConfigError as exc:  # a TLS file removed or broken since start: keep the items, try again
                self.failures[target] = self.failures.get(target, 0) + 1
                log.error("hook channel cannot be set up", target=target, error=str(exc))
                await asyncio.sleep(self._s.backoff_max_seconds)
                continue
            async with channel:
                stub = hpb_grpc.ReplacementHookStub(channel)
                while self._tls_files(target) == files:
                    try:
                        await self._step(target, stub)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("hook dispatcher step failed", target=target)
                        await asyncio.sleep(self._s.backoff_initial_seconds)
            log.info("hook TLS files changed; reconnecting with them", target=target)

    def _wait_before(self, target: str, seq: int, next_attempt_at: float) -> float:
        """Seconds until the head item may be tried again: our own back-off on the monotonic clock, or (an item
        queued before this process) the stored wall-clock time, capped at the longest back-off."""
        now = self._monotonic()
        known = self._retry_at.get(target)
        if known is None or known[0] != seq:
            known = self._retry_at[target] = (
                seq,
                now + min(next_attempt_at - self._clock(), self._s.backoff_max_seconds),
            )
        return known[1] - now

    async def _step(self, target: str, stub: ReplacementHookAsyncStub) -> None:
        seen = self._signal.seq
        item = await self._journal_call(self._journal.outbox_head, target)
        depth = await self._journal_call(self._journal.outbox_depth)
        self.depth[target] = depth.get(target, 0)
        self.deliveries = await self._journal_call(self._journal.outbox_deliveries)
        if item is None:
            try:
                async with asyncio.timeout(IDLE_RECHECK_SECONDS):
                    await self._signal.wait_beyond(seen)
            except TimeoutError:
                pass
            return
        wait = self._wait_before(target, item.seq, item.next_attempt_at)
        if wait > 0:
            await asyncio.sleep(wait)
            return
        request = fault_report_pb(item.payload, item.seq, self._node)
        try:
            ack = await stub.ReportFault(request, timeout=self._s.timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            self.failures[target] = self.failures.get(target, 0) + 1
            delay = backoff_delay(
                item.attempts, self._s.backoff_initial_seconds, self._s.backoff_max_seconds, self._rng
            )
            error = f"{exc.code().name}: {exc.details()}"
            self._retry_at[target] = (item.seq, self._monotonic() + delay)
            await self._journal_call(self._journal.outbox_failed, target, item.seq, self._clock() + delay, error)
            log.warning(
                "hook delivery failed", target=target, fault_id=item.fault_id, attempt=item.attempts + 1,
                retry_in=round(delay, 3), error=error,
            )  # fmt: skip
            return
        self._retry_at.pop(target, None)
        await self._journal_call(self._journal.outbox_delivered, target, item.seq, self._clock())
        self.delivered[target] = self.delivered.get(target, 0) + 1
        log.info("hook delivered", target=target, fault_id=item.fault_id, seq=item.seq, outcome=ack.outcome)
