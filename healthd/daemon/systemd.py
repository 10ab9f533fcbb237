"""systemd integration: sd_notify (READY, WATCHDOG, STATUS, STOPPING, RELOADING) and the watchdog loop.

Without ``NOTIFY_SOCKET`` (not started by systemd with Type=notify) every call here is a silent no-op. A message is
one AF_UNIX datagram of ``KEY=VALUE`` lines (sd_notify(3)); '@' in the address means the abstract namespace.

A send never blocks: the socket is non-blocking, and a message the listener's queue has no room for
(EAGAIN: it stopped reading; the kernel queues ``net.unix.max_dgram_qlen`` datagrams, 10 by default) is dropped and
counted, so a stuck listener can never freeze the event loop that sends the pings. systemd reads its socket all the
time; a proxy or test harness that stops reading costs dropped messages, shown by ``xpu_sd_notify_dropped_total``.
systemd-python's ``daemon.notify`` is not used for this: its send blocks.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from exporter.snapshot import Snapshot

log = structlog.get_logger("systemd")


class Notifier:
    """Sends sd_notify messages to the service manager, if there is one; never blocks (drops and counts)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self.via = "none" if self.address is None else "datagram"
        self.delivered = 0
        self.dropped: dict[str, int] = {"queue_full": 0, "unreachable": 0}
        self._target = ""
        self._sock: socket.socket | None = None
        if self.address is not None:
            self._target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, **fields: str | int) -> bool:
        """``notify(READY=1, STATUS="...")``; values must not contain newlines (they are replaced). False when the
        message was not delivered (no manager, its queue full, its socket gone)."""
        if self._sock is None:
            return False
        message = "\n".join(f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
        try:
            self._sock.sendto(message.encode(), self._target)
        except BlockingIOError:
            return self._dropped("queue_full", fields)
        except OSError:  # the socket went away (the manager restarted, a test's listener left): not our failure
            return self._dropped("unreachable", fields)
        self.delivered += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _dropped(self, reason: str, fields: Mapping[str, str | int]) -> bool:
        self.dropped[reason] += 1
        if reason == "queue_full" and self.dropped[reason] == 1:  # once: a stuck listener would be logged every 5 s
            log.warning("sd_notify listener is not reading; messages dropped and counted", keys=sorted(fields))
        else:
            log.debug("sd_notify message dropped", reason=reason, keys=sorted(fields))
        return False

    def ready(self, status: str) -> bool:
        return self.notify(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(STOPPING=1, STATUS=status)

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload; older ones ignore it.
        return self.notify(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between pings (half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises), or None if disabled."""
    env = os.environ if env is None else env
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner and owner.isdecimal() and int(owner) != (os.getpid() if pid is None else pid):
        return None  # the watchdog is meant for another process (we were started by the service, not as it)
    try:
        usec = int(raw)
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


@dataclass(frozen=True, slots=True)
class Progress:
    ok: bool
    reason: str


class SamplerProgress:
    """Is the sampler publishing new Snapshots? Stalled when no new one arrived within ``limit`` seconds.

    A hung card does not stall the sampler (its worker is skipped), so a stall here means the coordinator itself is
    stuck: restarting the daemon is the right answer.
    """

    def __init__(
        self, latest: Callable[[], Snapshot | None], limit: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._latest = latest
        self._limit = limit
        self._monotonic = monotonic
        self._seen_seq: int | None = None
        self._seen_at = monotonic()

    def __call__(self) -> Progress:
        now = self._monotonic()
        snap = self._latest()
        seq = None if snap is None else snap.seq
        if seq != self._seen_seq:
            self._seen_seq, self._seen_at = seq, now
        idle = now - self._seen_at
        if idle > self._limit:
            return Progress(False, f"sampler made no progress for {idle:.0f}s (limit {self._limit:.0f}s)")
        return Progress(True, "ok")


class Watchdog:
    """Pings WATCHDOG=1 from the event loop while ``progress`` says the daemon moves.

    Running on the event loop is the point: a blocked loop cannot ping, so systemd restarts the daemon.
    STATUS is refreshed on every tick with ``summary()``.
    """

    def __init__(
        self,
        notifier: Notifier,
        interval: float | None,
        progress: Callable[[], Progress],
        summary: Callable[[], str],
        *,
        status_every: float = 5.0,
    ) -> None:
        self._notifier = notifier
        self._interval = interval
        self._progress = progress
        self._summary = summary
        self._status_every = status_every
        self._stalled = False

    async def run(self) -> None:
        tick = min(x for x in (self._interval, self._status_every) if x is not None)
        while True:
            self.tick()
            await asyncio.sleep(tick)

    def tick(self) -> None:
        progress = self._progress()
        if progress.ok:
            if self._stalled:
                log.info("progress resumed; watchdog pings resume")
                self._stalled = False
            if self._interval is not None:
                self._notifier.watchdog()
            try:
                summary = self._summary()
            except Exception:  # a broken status line must not stop the pings (that would restart the daemon)
                log.exception("status summary failed")
                summary = "running (status summary failed; see the log)"
            self._notifier.status(summary)
            return
        if not self._stalled:
            log.error("watchdog pings stopped", reason=progress.reason)
            self._stalled = True
        self._notifier.status(f"stalled: {progress.reason}")
