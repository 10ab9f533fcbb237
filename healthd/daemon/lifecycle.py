"""The daemon's life as a systemd service: start, READY, watchdog and STATUS, SIGHUP reload, graceful stop.

Order matters and is what systemd relies on:
  1. every socket is bound and the first Snapshot exists      -> READY=1 (Type=notify: dependants start now)
  2. while the sampler publishes and the event loop turns      -> WATCHDOG=1 every WATCHDOG_USEC/2, STATUS=summary
  3. SIGHUP                                                   -> RELOADING=1, re-read the file, READY=1
  4. SIGTERM/SIGINT                                           -> STOPPING=1, finish in-flight calls, flush, exit 0
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from exporter.snapshot import Snapshot
from exporter.webconfig import WebConfig, WebConfigError
from healthd.daemon.config import Config, ConfigError
from healthd.daemon.reload import plan_reload
from healthd.daemon.systemd import Notifier, SamplerProgress, Watchdog, watchdog_interval
from healthd.logs import configure_logging
from healthd.rpc.transport import load_metrics_web_config

log = structlog.get_logger("lifecycle")

LoopHook = Callable[[asyncio.AbstractEventLoop], object]  # called once with the running loop, before start

# SIGTERM to exit: within 10 s whatever is hung (systemd's TimeoutStopSec is 30 s); the daemon's own budget
STOP_BUDGET_SECONDS = 8.0


class Service(Protocol):
    """What the lifecycle drives: healthd.daemon.daemon.Daemon, or a test's stand-in."""

    config: Config

    @property
    def stale_seconds(self) -> float: ...

    def latest(self) -> Snapshot | None: ...

    def status_line(self) -> str: ...

    def set_web_config(self, web_config: WebConfig | None) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Lifecycle:
    def __init__(
        self,
        daemon: Service,
        notifier: Notifier,
        *,
        reload_config: Callable[[], Config] | None = None,
        watchdog_seconds: float | None = None,
        loop_hooks: Sequence[LoopHook] = (),
        on_ready: Callable[[], object] | None = None,
    ) -> None:
        self._daemon = daemon
        self._on_ready = on_ready
        self._loop_hooks = tuple(loop_hooks)
        self._notifier = notifier
        self._reload_config = reload_config
        self._watchdog_seconds = watchdog_seconds if watchdog_seconds is not None else watchdog_interval()
        self._stop = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._schedule_reload)
        for hook in self._loop_hooks:  # e.g. a test's way to block the loop on purpose
            hook(loop)
        daemon = self._daemon
        await daemon.start()
        while daemon.latest() is None and not self._stop.is_set():
            self._notifier.status("waiting for the first sample")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 1.0)
        watchdog_task: asyncio.Task[None] | None = None
        if not self._stop.is_set():
            self._notifier.ready(daemon.status_line())
            log.info("ready", notify=self._notifier.via, watchdog_seconds=self._watchdog_seconds)
            if self._on_ready is not None:  # the process-wide settings of xpu-healthd's main (healthd/daemon/heap.py)
                self._on_ready()
            # the same limit as "samples are stale" in the node status: one rule for both
            progress = SamplerProgress(daemon.latest, daemon.stale_seconds)
            watchdog = Watchdog(self._notifier, self._watchdog_seconds, progress, daemon.status_line)
            watchdog_task = asyncio.create_task(watchdog.run(), name="watchdog")
        await self._stop.wait()
        self._notifier.stopping("stopping: finishing in-flight calls")
        if watchdog_task is not None:
            watchdog_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog_task
        if self._reloading is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reloading
        try:
            await asyncio.wait_for(daemon.stop(), STOP_BUDGET_SECONDS + 1.0)
        except TimeoutError:
            log.error("stop did not finish in time; exiting anyway")
        return 0

    def _schedule_reload(self) -> None:
        if self._reloading is not None and not self._reloading.done():
            log.info("reload already in progress; SIGHUP ignored")
            return
        self._reloading = asyncio.create_task(self.reload(), name="reload")

    async def reload(self) -> None:
        """Re-read the config file; apply what can change safely and name what needs a restart."""
        daemon = self._daemon
        if self._reload_config is None:
            log.info("SIGHUP: nothing to reload")
            return
        self._notifier.reloading()
        try:
            new = await asyncio.to_thread(self._reload_config)
            new.check_transport()
            web_config = await asyncio.to_thread(load_metrics_web_config, new.transport)
        except ConfigError as exc:
            log.error("reload failed; the running settings stay", error=str(exc))
            self._notifier.ready(f"reload failed ({exc}); {daemon.status_line()}")
            return
        try:
            daemon.set_web_config(web_config)
        except WebConfigError as exc:  # a certificate replaced between the check and now
            log.error("reload failed; the running settings stay", error=f"transport.metrics_web_config_file: {exc}")
            self._notifier.ready(f"reload failed ({exc}); {daemon.status_line()}")
            return
        plan = plan_reload(daemon.config, new)
        if "daemon.log_level" in plan.applied:
            configure_logging(new.log_level)
        daemon.config = plan.config
        log.info(
            "configuration reloaded",
            applied=list(plan.applied),
            needs_restart=list(plan.needs_restart),
            metrics_web_config=str(new.transport.metrics_web_config_file or "none"),
        )
        if plan.needs_restart:
            log.warning("some changed settings need a restart", options=list(plan.needs_restart))
        self._notifier.ready(daemon.status_line())
