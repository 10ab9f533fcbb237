"""The sd_notify component: the daemon's one ``Notifier`` (healthd/daemon/systemd.py), which the lifecycle sends
READY, WATCHDOG, STATUS, RELOADING and STOPPING through, and its delivery counters on /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.collectors import Collector
from exporter.collectors.series import COUNTER, Exposer, Family, SeriesCollector
from exporter.snapshot import Snapshot
from healthd.component import ComponentBase
from healthd.daemon.systemd import Notifier
from healthd.node import Node

SENT = Family("xpu_sd_notify_sent", "sd_notify messages handed to the service manager's socket.", COUNTER)
DROPPED = Family(
    "xpu_sd_notify_dropped",
    "sd_notify messages dropped, by reason: queue_full (the listener is not reading; a send never waits for it) "
    "or unreachable (no socket at NOTIFY_SOCKET).",
    COUNTER,
    ("reason",),
)


class NotifyCollector(SeriesCollector):
    name = "notify"

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    def write(self, snapshot: Snapshot, now: float, out: Exposer) -> None:
        out.declare(SENT, DROPPED)
        n = self._notifier
        dropped = sorted(n.dropped.items())
        if (rows := out.block("notify", (n.delivered, tuple(dropped)))) is not None:
            rows.add(SENT, (), float(n.delivered))
            for reason, count in dropped:
                rows.add(DROPPED, (reason,), float(count))


class NotifyComponent(ComponentBase):
    name = "notify"

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    def collectors(self) -> Sequence[Collector]:
        return [NotifyCollector(self.notifier)]

    async def stop(self) -> None:
        self.notifier.close()  # STOPPING went out before the components stop: nothing is sent after it


def build(node: Node) -> NotifyComponent:
    return NotifyComponent(Notifier())  # NOTIFY_SOCKET from the process environment, as systemd sets it
