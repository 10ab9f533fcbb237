"""The daemon: the backend and its node context, chosen once, and the components built over it from one list.

``COMPONENTS`` is the list, in start order; each entry is a component module's ``build(node)``. Start runs the
components in order, stop in reverse, within a time budget that nothing hung can exceed: each component's stop gets
its share and the daemon goes on when one overruns (healthd/daemon/lifecycle.py says when).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields

import structlog

from exporter.backends.protocol import Backend
from exporter.backends.select import choose_backend
from exporter.snapshot import Snapshot
from exporter.version import VERSION
from exporter.webconfig import WebConfig
from healthd.attribution import component as attribution
from healthd.component import Component
from healthd.daemon import cards, device, health, metrics, notify, rpc
from healthd.daemon.config import Config
from healthd.daemon.lifecycle import STOP_BUDGET_SECONDS
from healthd.daemon.metrics import MetricsEndpoint
from healthd.daemon.notify import NotifyComponent
from healthd.daemon.systemd import Notifier
from healthd.host.view import choose_host
from healthd.node import Builder, Node
from healthd.partition import component as partitions
from healthd.sim import component as simulation
from healthd.topology import component as topology

log = structlog.get_logger("main")

# Started in this order, stopped in reverse. The simulated node's files come first and go last: every reader of the
# node reads them. Attribution reads kubelet once before the first Snapshot, so the first one is attributed whole.
# The sampler comes next and stops after everything that reads its Snapshots or calls the driver. The endpoints come
# last: /metrics serves the collectors of every component before it, and the gRPC sockets appear once every service
# behind them has started (and close first).
COMPONENTS: tuple[Builder, ...] = (
    simulation.build,
    attribution.build,
    device.build,
    health.build,
    topology.build,
    cards.build,
    partitions.build,
    notify.build,
    metrics.build,
    rpc.build,
)


def open_node(config: Config, backend: Backend) -> Node:
    """The node context for ``config`` on ``backend``: its sections, the host view chosen for the backend, the state
    directory (made if missing)."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    sections = [getattr(config, f.name) for f in fields(Config) if f.name != "source"]
    return Node(
        [*sections, config],
        backend,
        choose_host(config.host, backend, config.state_dir),
        state_dir=config.state_dir,
        runtime_dir=config.runtime_dir,
    )


def build_components(node: Node, builders: tuple[Builder, ...] = COMPONENTS) -> tuple[Component, ...]:
    for build in builders:
        component = build(node)
        if component is not None:
            node.add(component)
    return node.components


class Daemon:
    def __init__(self, config: Config, *, allow_fallback: bool) -> None:
        self.config = config
        choice = choose_backend(config.simulate, allow_fallback=allow_fallback)
        self.backend = choice.backend
        self.backend_reason = choice.reason
        self.node = open_node(config, self.backend)
        self.components = build_components(self.node)
        endpoint = self.node.built(MetricsEndpoint)
        assert endpoint is not None, "the component list builds the metrics endpoint"
        self.metrics = endpoint
        notifier = self.node.built(NotifyComponent)
        assert notifier is not None, "the component list builds the notifier"
        self.notifier: Notifier = notifier.notifier

    # ----- what the lifecycle (systemd) needs -------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        return self.node.sampler.latest()

    @property
    def stale_seconds(self) -> float:
        return self.node.stale_seconds

    def status_line(self) -> str:
        """One line for `systemctl status`: the node status and where the metrics are."""
        http = self.metrics.http
        return f"{self.node.status().summary}; metrics {http.scheme} :{http.port}"

    def set_web_config(self, web_config: WebConfig | None) -> None:
        self.metrics.http.set_web_config(web_config)

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
