"""The metrics endpoint: /metrics over every component's collectors, /healthz from the node status, and the status
page on the metrics port. Built after the components whose collectors it serves."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import structlog

from exporter.collectors import Collector
from exporter.collectors.render import SnapshotRenderer
from exporter.executor import in_daemon_thread
from exporter.exposition import PROMETHEUS_FORMATS, ExpositionCache
from exporter.http import Health, MetricsHTTPServer, parse_listen_address
from exporter.inflight import RequestsInFlight
from exporter.sampler import SamplerSettings
from exporter.snapshot import Snapshot
from exporter.version import VERSION
from exporter.webconfig import WebConfig
from healthd.component import ComponentBase
from healthd.daemon.config import Config
from healthd.daemon.heap import malloc_trimmer
from healthd.daemon.runbooks import alert_runbooks
from healthd.daemon.status_hook import HookView
from healthd.faults.settings import HookSettings
from healthd.findings import Action
from healthd.node import Node
from healthd.partition.component import PartitionsComponent
from healthd.rpc.transport import load_metrics_web_config

log = structlog.get_logger("metrics")


class MetricsEndpoint(ComponentBase):
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
        requests: RequestsInFlight | None = None,
    ) -> None:
        """``requests``: where the server counts what it answers (the node's: its cycle gives way to them)."""
        self.listen = listen
        self._latest = latest
        self.renderer = SnapshotRenderer(collectors)
        # each published Snapshot rendered for the formats scrapers ask for; a scrape is served those bytes
        self.exposition = ExpositionCache(
            self.renderer, interval=interval_seconds, max_age=max_age_seconds, expect=PROMETHEUS_FORMATS
        )
        self.http = MetricsHTTPServer(
            parse_listen_address(listen),
            self.exposition,
            health=health,
            landing=landing,
            web_config=web_config,
            requests=requests,
        )

    async def start(self) -> None:
        if (snapshot := self._latest()) is not None:  # the sampler's first, so the first scrape finds it rendered
            await in_daemon_thread(self.exposition.publish, snapshot)
        self.http.start()
        log.info("metrics listening", address=self.listen, port=self.http.port, scheme=self.http.scheme)

    async def stop(self) -> None:
        await in_daemon_thread(self.http.stop)


def status_page(node: Node) -> Callable[[], str]:
    """The status page over the node's answers (and the partitions, where they are served)."""
    partitions = node.built(PartitionsComponent)
    hook_settings = node.settings(HookSettings)
    hook = HookView(hook_settings.endpoints, Action[hook_settings.min_action.upper()], node.hook_deliveries)
    runbooks = alert_runbooks()

    def render() -> str:
        from healthd.daemon.status_page import render_status_page  # on the first visit, not at start-up

        return render_status_page(
            node.sampler.latest(),
            checks=node.check_states,
            faults=node.active_faults,
            partitions=partitions.records if partitions is not None else tuple,
            hostname=socket.gethostname(),
            version=VERSION,
            node=node.status(),
            attribution=node.attribution,
            hook=hook,
            runbooks=runbooks,
        )

    return render


def build(node: Node) -> MetricsEndpoint:
    config = node.settings(Config)
    sampling = node.settings(SamplerSettings)

    def healthz() -> Health:
        status = node.status()
        return Health(status.serving, f"{status.level}: {status.summary}")

    endpoint = MetricsEndpoint(
        config.metrics_listen,
        node.sampler.latest,
        node.collectors(),
        health=healthz,
        landing=status_page(node),
        web_config=load_metrics_web_config(config.transport),
        interval_seconds=sampling.interval_seconds,
        # past this age a scrape renders afresh, so xpu_sample_age_seconds keeps growing when sampling stops
        max_age_seconds=max(
            2 * sampling.interval_seconds, sampling.interval_seconds + 2 * sampling.call_deadline_seconds
        ),
        requests=node.requests,
    )
    node.sampler.subscribe(publisher(endpoint.exposition, malloc_trimmer()), "exposition")
    return endpoint


def publisher(exposition: ExpositionCache, trim: Callable[[], object] | None) -> Callable[[Snapshot | None], None]:
    """The sampler's subscriber: publish, then give the render's freed pages back (healthd/daemon/heap.py)."""

    def publish(snapshot: Snapshot | None) -> None:
        renders = exposition.renders["publish"]
        exposition.publish(snapshot)
        if trim is not None and exposition.renders["publish"] != renders:
            trim()

    return publish
