"""systemd integration: sd_notify (READY, WATCHDOG, STATUS, STOPPING, RELOADING) and the watchdog loop.

Without ``NOTIFY_SOCKET`` (not started by systemd with Type=notify) every call here is a silent no-op.
Messages go through systemd-python's ``systemd.daemon.notify`` when it can be imported; otherwise the datagram
is written to the socket directly (the protocol is one AF_UNIX datagram of ``KEY=VALUE`` lines, sd_notify(3)).
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

NotifySender = Callable[[str], bool]


def _systemd_python_sender() -> NotifySender | None:
    try:
        from systemd import daemon
    except ImportError:
        return None

    def send(message: str) -> bool:
        try:
            return bool(daemon.notify(message))
        except OSError:  # the socket went away (the manager restarted, a test's listener left): not our failure
            return False

    return send


def _datagram_sender(address: str) -> NotifySender:
    """Fallback when systemd-python is missing: one datagram per message; '@' means the abstract namespace."""
    target = "\0" + address[1:] if address.startswith("@") else address

    def send(message: str) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(message.encode(), target)
            except OSError:
                return False
        return True

    return send


class Notifier:
    """Sends sd_notify messages to the service manager, if there is one."""

    def __init__(self, env: Mapping[str, str] | None = None, *, prefer_systemd_python: bool = True) -> None:
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self.via = "none"
        self._send: NotifySender | None = None
        if self.address is None:
            return
        sender = _systemd_python_sender() if prefer_systemd_python else None
        if sender is not None:
            self._send, self.via = sender, "systemd-python"
        else:
            self._send, self.via = _datagram_sender(self.address), "datagram"

    @property
    def enabled(self) -> bool:
        return self._send is not None

    def notify(self, **fields: str | int) -> bool:
        """``notify(READY=1, STATUS="...")``; values must not contain newlines (they are replaced)."""
        if self._send is None:
            return False
        lines = [f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items()]
        ok = self._send("\n".join(lines))
        if not ok:
            log.debug("sd_notify failed", fields=sorted(fields))
        return ok

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
