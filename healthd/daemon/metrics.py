"""The metrics side of the daemon: the card collectors (and dcgm-exporter's names), and /metrics with /healthz and
the status page on the metrics port."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from exporter.attribution.attributor import Attribution
from exporter.collectors import Collector, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.collectors.render import SnapshotRenderer
from exporter.executor import in_daemon_thread
from exporter.exposition import PROMETHEUS_FORMATS, ExpositionCache
from exporter.http import Health, MetricsHTTPServer, parse_listen_address
from exporter.snapshot import Snapshot
from exporter.webconfig import WebConfig
from healthd.faults.engine import FaultEngine
from healthd.rpc.server import Service
from healthd.settings import option

log = structlog.get_logger("metrics")


@dataclass(frozen=True, slots=True)
class ExporterSettings:
    """[exporter]"""

    dcgm_compat: bool = False  # also export dcgm-exporter's default series (docs/dcgm-compat.md)
    # the host-name label of dcgm-compat series: "Hostname" for dcgm-exporter releases before 4.6.0-4.8.3
    dcgm_hostname_label: str = option("hostname", choices=("hostname", "Hostname"))


def last_xid_per_gpu(engine: FaultEngine) -> Callable[[], Mapping[int, int]]:
    """The XID of each card's most recent active XID fault, for dcgm-exporter's DCGM_FI_DEV_XID_ERRORS."""

    def read() -> Mapping[int, int]:
        latest: dict[int, tuple[float, int]] = {}
        for fault in engine.active_faults():
            xid = fault.evidence.get("xid", "")
            if fault.gpu is None or not fault.code.startswith("xid_") or not xid.isdigit():
                continue
            if fault.gpu.index not in latest or fault.last_seen >= latest[fault.gpu.index][0]:
                latest[fault.gpu.index] = (fault.last_seen, int(xid))
        return {gpu: xid for gpu, (_, xid) in latest.items()}

    return read


class CardMetrics:
    """The card, MIG and exporter collectors (and, when asked, dcgm-exporter's series)."""

    name = "cards"

    def __init__(
        self,
        settings: ExporterSettings,
        last_xid: Callable[[], Mapping[int, int]] | None = None,
        attribution: Callable[[], Attribution | None] | None = None,
    ) -> None:
        self._collectors: list[Collector] = list(default_collectors())
        if settings.dcgm_compat:  # dcgm-exporter names; the host name as dcgm-exporter sets it in Kubernetes
            hostname = os.environ.get("NODE_NAME") or socket.gethostname()
            self._collectors.append(
                DcgmCompatCollector(
                    hostname, last_xid, hostname_label=settings.dcgm_hostname_label, attribution=attribution
                )
            )

    def collectors(self) -> Sequence[Collector]:
        return self._collectors

    def services(self) -> Sequence[Service]:
        return ()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class MetricsEndpoint:
    """/metrics over every component's collectors, /healthz from the node status, / the status page."""

    name = "http"

    def __init__(
        self,
        listen: str,
        latest: Callable[[], Snapshot | None],
        collectors: Sequence[Collector],
        *,
        health: Callable[[], Health],
        landing: Callable[[], str],
        web_config: WebConfig | None,
        interval_seconds: float,
        max_age_seconds: float,
    ) -> None:
        self.listen = listen
        self._latest = latest
        self.renderer = SnapshotRenderer(collectors)
        # each published Snapshot rendered for the formats scrapers ask for; a scrape is served those bytes
        self.exposition = ExpositionCache(
            self.renderer, interval=interval_seconds, max_age=max_age_seconds, expect=PROMETHEUS_FORMATS
        )
        self.http = MetricsHTTPServer(
            parse_listen_address(listen), self.exposition, health=health, landing=landing, web_config=web_config
        )

    def collectors(self) -> Sequence[Collector]:
        return ()

    def services(self) -> Sequence[Service]:
        return ()

    async def start(self) -> None:
        if (snapshot := self._latest()) is not None:  # the sampler's first, so the first scrape finds it rendered
            await in_daemon_thread(self.exposition.publish, snapshot)
        self.http.start()
        log.info("metrics listening", address=self.listen, port=self.http.port, scheme=self.http.scheme)

    async def stop(self) -> None:
        await in_daemon_thread(self.http.stop)
