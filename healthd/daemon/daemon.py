"""The daemon: the backend and its host view, chosen once, and an ordered list of components.

Start runs the components in order, stop in reverse, within a time budget that nothing hung can exceed: each
component's stop gets its share and the daemon goes on when one overruns (healthd/daemon/lifecycle.py says when).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import structlog

from exporter.backends.select import choose_backend
from exporter.health import stale_after
from exporter.http import Health
from exporter.snapshot import Snapshot
from exporter.version import VERSION
from exporter.webconfig import WebConfig
from healthd.attribution.component import AttributionComponent
from healthd.component import Component
from healthd.daemon.config import Config
from healthd.daemon.device import DeviceComponent
from healthd.daemon.health import JOURNAL_FILE, FindingSources, HealthComponent
from healthd.daemon.lifecycle import STOP_BUDGET_SECONDS
from healthd.daemon.metrics import CardMetrics, MetricsEndpoint, last_xid_per_gpu
from healthd.daemon.rpc import RpcEndpoints
from healthd.daemon.status import NodeHealth
from healthd.daemon.status_page import render_status_page
from healthd.faults.journal import Journal
from healthd.faults.out_of_service import gpus_out_of_service
from healthd.host.view import choose_host
from healthd.partition.component import PartitionsComponent
from healthd.partition.planner import topology_aware
from healthd.rpc.transport import is_tcp, load_grpc_tls, load_metrics_web_config, socket_group_id
from healthd.sim.component import SimulationComponent
from healthd.topology.component import TopologyComponent

log = structlog.get_logger("main")


class Daemon:
    def __init__(self, config: Config, *, allow_fallback: bool) -> None:
        self.config = config
        choice = choose_backend(config.simulate, allow_fallback=allow_fallback)
        self.backend = choice.backend
        self.backend_reason = choice.reason
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.host = choose_host(config.host, self.backend, config.state_dir)
        self.device = DeviceComponent(config.sampler, self.backend)
        sampler = self.sampler = self.device.sampler
        self.attribution = AttributionComponent(config.attribution, self.host, sampler)
        self.health = HealthComponent(
            Journal(config.state_dir / JOURNAL_FILE),
            config.faults,
            config.hook,
            FindingSources(config.health, self.device.device, sampler, self.host),
        )
        self.topology = TopologyComponent(
            config.topology, self.device.device, sampler, self.host.sysfs_root, self.gpus_out_of_service
        )
        self.partitions = (
            PartitionsComponent(
                config.partitions,
                self.device.device,
                self.host,
                config.state_dir,
                runtime_dir=config.runtime_dir,
                snapshot=sampler.latest,
                pod_exists=self.attribution.kubelet.pod_exists,
                device_holders=self.attribution.kubelet.device_holders,
                order_any=topology_aware(self.topology.first_card),
                out_of_service=self.gpus_out_of_service,
            )
            if config.partitions.enabled
            else None
        )
        cards = CardMetrics(config.exporter, last_xid_per_gpu(self.health.engine), self.attribution.attributor.latest)
        parts: list[Component] = [self.device, self.attribution, self.health, self.topology, cards]
        if self.partitions is not None:
            parts.append(self.partitions)
        parts.append(SimulationComponent(self.backend))
        s = config.sampler
        access = self.device.device.access
        self.node = NodeHealth(
            sampler.latest,
            access,
            stale_after(s.interval_seconds, s.call_deadline_seconds, s.open_deadline_seconds),
            backlogs=self._backlogs,
        )
        self.metrics = MetricsEndpoint(
            config.metrics_listen,
            sampler.latest,
            [c for part in parts for c in part.collectors()],
            health=self._healthz,
            landing=self.status_page,
            web_config=load_metrics_web_config(config.transport),
            interval_seconds=s.interval_seconds,
            # past this age a scrape renders afresh, so xpu_sample_age_seconds keeps growing when sampling stops
            max_age_seconds=max(2 * s.interval_seconds, s.interval_seconds + 2 * s.call_deadline_seconds),
        )
        sampler.subscribe(self.metrics.exposition.publish, "exposition")
        t = config.transport
        self.rpc = RpcEndpoints(
            [svc for part in parts for svc in part.services()],
            self.node,
            addresses=config.grpc_addresses,
            tls=load_grpc_tls(t, [a for a in config.grpc_addresses if is_tcp(a)]),
            socket_mode=t.grpc_socket_mode,
            socket_group=socket_group_id(t.grpc_socket_group),
            admin_socket=config.admin_socket,
            admin_group=config.daemon.admin_group,
        )
        # started in this order, stopped in reverse: the driver first and last; the gRPC sockets appear once every
        # service behind them has started (and close first), so no caller meets a service that is not there yet.
        # Attribution comes first: it starts the simulated node's files before the first sample is handed out.
        self.components: list[Component] = [self.attribution, self.device, self.health, self.metrics]
        self.components += [p for p in parts if p not in self.components]
        self.components.append(self.rpc)

    # ----- what the lifecycle (systemd) needs -------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        return self.sampler.latest()

    @property
    def stale_seconds(self) -> float:
        return self.node.stale_seconds

    def status_line(self) -> str:
        """One line for `systemctl status`: the node status and where the metrics are."""
        http = self.metrics.http
        return f"{self.node.status().summary}; metrics {http.scheme} :{http.port}"

    def set_web_config(self, web_config: WebConfig | None) -> None:
        self.metrics.http.set_web_config(web_config)

    # ----- cross-component views --------------------------------------------------------------------------------

    def _backlogs(self) -> dict[str, int]:
        health = self.health
        return {"hook outbox": sum(health.dispatcher.depth.values()), "journal": health.io.backlog()}

    def _healthz(self) -> Health:
        status = self.node.status()
        return Health(status.serving, f"{status.level}: {status.summary}")

    def gpus_out_of_service(self) -> frozenset[int]:
        """Cards kept from new work (``any`` placement, PreferredAllocation): active faults of action reset_gpu or
        stronger, and cards whose driver calls are hung right now."""
        hung = frozenset(self.device.device.access.hung_cards())
        return gpus_out_of_service(self.health.engine.active_faults()) | hung

    def status_page(self) -> str:
        manager = self.partitions.manager if self.partitions is not None else None
        return render_status_page(
            self.sampler.latest(),
            checks=self.health.engine.check_states,
            faults=self.health.engine.active_faults,
            partitions=(lambda: manager.view().partitions) if manager is not None else tuple,
            hostname=socket.gethostname(),
            version=VERSION,
            node=self.node.status(),
        )

    # ----- start and stop ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        log.info(
            "starting", version=VERSION, backend=self.backend.name, why=self.backend_reason, config=self.config.source
        )
        for component in self.components:
            await component.start()

    async def stop(self, budget_seconds: float = STOP_BUDGET_SECONDS) -> None:
        """Stop in reverse order within ``budget_seconds`` in all, whatever is hung; never wait on the driver."""
        log.info("stopping")
        end = time.monotonic() + budget_seconds
        for component in reversed(self.components):
            left = max(0.1, min(3.0, end - time.monotonic()))
            await _bounded(component.name, component.stop, left)
        log.info("stopped")


async def _bounded(name: str, stop: Callable[[], Awaitable[None]], seconds: float) -> None:
    try:
        await asyncio.wait_for(stop(), seconds)
    except TimeoutError:
        log.warning("stop step did not finish in time; going on", step=name)
    except Exception:
        log.exception("stop step failed; going on", step=name)
