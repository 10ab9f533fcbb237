"""The fault pipeline as the daemon runs it: journal, engine, hook dispatcher, Health service, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

import structlog

from exporter.executor import SerialExecutor
from healthd.faults.engine import FaultEngine
from healthd.faults.escalation import read_boot_id
from healthd.faults.journal import Journal
from healthd.faults.metrics import FaultMetricsCollector
from healthd.faults.notify import CommitSignal
from healthd.faults.outbox import HookDispatcher
from healthd.faults.service import HealthService
from healthd.faults.settings import FaultsSettings, HookSettings
from healthd.findings import Action

log = structlog.get_logger("faults")

JOURNAL_FILE = "faults.sqlite"
TICK_SECONDS = 10.0


class FaultRuntime:
    """``engine`` is the sink the probe runner calls (``report()``/``event()``), from the loop or any thread."""

    def __init__(
        self,
        journal: Journal,
        faults: FaultsSettings,
        hook: HookSettings,
        *,
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
    ) -> None:
        self.journal = journal
        self.engine = FaultEngine(
            journal,
            faults,
            boot_id=boot_id if boot_id is not None else read_boot_id(faults.boot_id_path),
            hook_targets=hook.endpoints,
            hook_min_action=Action[hook.min_action.upper()],
            clock=clock,
        )
        self.signal = CommitSignal(journal.last_seq)
        self.engine.add_listener(self.signal.notify)
        self.io = SerialExecutor("journal-io")  # journal reads, outbox updates and the engine tick, off the loop
        self.dispatcher = HookDispatcher(
            journal, hook, self.signal, self.io, node_name=hook.node_name or socket.gethostname(), clock=clock
        )
        self.service = HealthService(self.engine, self.signal, self.io)
        self.admin_service = HealthService(self.engine, self.signal, self.io, writable=True)  # on the admin socket
        self.collector = FaultMetricsCollector(self.engine, self.dispatcher)
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.signal.attach(asyncio.get_running_loop())
        self.dispatcher.start()
        self._ticker = asyncio.create_task(self._tick_forever(), name="fault engine tick")

    async def stop(self, flush_seconds: float = 5.0) -> None:
        """Stop delivering and ticking, let queued journal work finish (at most ``flush_seconds``), close the
        journal."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.dispatcher.stop()
        # after what is queued; the journal's own lock waits out a commit that is in flight on another thread
        closed = asyncio.wrap_future(self.io.submit(self.journal.close))
        done, _ = await asyncio.wait({closed}, timeout=flush_seconds)
        self.io.shutdown(wait=False)
        if not done:
            log.warning("journal work still running at stop; left to finish", seconds=flush_seconds)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.io, self.engine.tick)
            except Exception:
                log.exception("fault engine tick failed")
            await asyncio.sleep(TICK_SECONDS)
