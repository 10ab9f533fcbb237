"""The node context every component is built from: gpud's GPUdInstance, made small.

It holds what the whole daemon shares, chosen once: the settings (each section by its class), the backend and the
only way to it (the device lanes), the sampler, the host view, the state and runtime directories. And it answers,
by name, the few questions one component asks of another: whether kubelet lists a pod and who holds each device
(attribution's pod-resources client), which card to use first (the topology), which cards are out of service and
which faults and check results are active (the health component). The component that knows registers its answer
with ``answer``; the others ask the node, never each other, so no component holds another's parts, and a question
nobody answers has a neutral answer (nothing known, nothing out of service).

The node also keeps the components built so far (``add``), in the order the daemon builds them: the metrics and gRPC
endpoints, built last, serve every earlier component's collectors and services.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import structlog

from exporter.attribution.attributor import Attribution
from exporter.attribution.kubelet import DeviceListing
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeviceAccess
from exporter.backends.protocol import Backend
from exporter.collectors.base import Collector
from exporter.health import NodeStatus, stale_after, summarize
from exporter.inflight import RequestsInFlight
from exporter.sampler import Sampler, SamplerSettings
from exporter.supervision import Workers, WorkersCollector
from healthd.component import Component
from healthd.faults.engine import CheckState
from healthd.faults.fault import Fault, HookDelivery
from healthd.faults.out_of_service import gpus_out_of_service
from healthd.host.view import HostView
from healthd.rpc.server import Service

T = TypeVar("T")
C = TypeVar("C")
log = structlog.get_logger("status")


class PodDirectory(Protocol):
    """Kubelet's pod-resources as the node last read them; None when that answer is not current."""

    def pod_exists(self, namespace: str, name: str) -> bool | None: ...

    def device_holders(self) -> DeviceListing | None: ...


class CardPlacement(Protocol):
    def first_card(self, fitting: Sequence[int]) -> int | None: ...


class FaultBook(Protocol):
    """The fault engine's state as committed, and what is waiting to be written or delivered."""

    def active_faults(self) -> Sequence[Fault]: ...

    def check_states(self) -> Sequence[CheckState]: ...

    def backlogs(self) -> Mapping[str, int]: ...

    def hook_deliveries(self) -> Sequence[HookDelivery]: ...


class Node:
    def __init__(
        self,
        settings: Iterable[object],
        backend: Backend,
        host: HostView,
        *,
        state_dir: Path,
        runtime_dir: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``settings``: each section's settings object (one class per section), and whatever whole configuration
        the daemon's own parts read."""
        self._settings: dict[type, object] = {}
        for section in settings:
            if type(section) in self._settings:
                raise TypeError(f"two settings of class {type(section).__name__}: a class is one section")
            self._settings[type(section)] = section
        self.backend = backend
        self.host = host
        self.state_dir = state_dir
        self.runtime_dir = runtime_dir  # the main gRPC socket's directory
        self.clock = clock
        sampling = self.settings(SamplerSettings)
        # what the metrics server is answering: the daemon's own cycle (card lanes, attribution, probes, the
        # render) gives way to it, so a scrape does not queue for the GIL behind a whole node's work
        self.requests = RequestsInFlight()
        self.device = GuardedBackend(
            DeviceAccess(backend, sampling, give_way=self.requests)
        )  # the only way to the driver
        self.sampler = Sampler(self.device, sampling)
        self.workers = Workers()  # the long-lived threads, supervised (a failure degrades the status)
        # past this age of the last Snapshot the node is down (and the watchdog stops)
        self.stale_seconds = stale_after(
            sampling.interval_seconds, sampling.call_deadline_seconds, sampling.open_deadline_seconds
        )
        self._components: list[Component] = []
        self._pods: PodDirectory | None = None
        self._placement: CardPlacement | None = None
        self._faults: FaultBook | None = None
        self._attribution: Callable[[], Attribution | None] | None = None

    def settings(self, cls: type[T]) -> T:
        """The configured section of class ``cls``."""
        found = self._settings.get(cls)
        if not isinstance(found, cls):
            raise LookupError(f"no {cls.__name__} in this node's settings")
        return found

    # ----- the components built so far ------------------------------------------------------------------------

    def add(self, component: Component) -> None:
        self._components.append(component)

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(self._components)

    def collectors(self) -> list[Collector]:
        return [c for part in self._components for c in part.collectors()] + [WorkersCollector(self.workers)]

    def services(self) -> list[Service]:
        return [s for part in self._components for s in part.services()]

    def built(self, cls: type[C]) -> C | None:
        """The component of class ``cls``, if one was built (for the daemon's own parts that show the others)."""
        return next((c for c in self._components if isinstance(c, cls)), None)

    # ----- questions one component answers for the others -------------------------------------------------------

    def answer(
        self,
        *,
        pods: PodDirectory | None = None,
        placement: CardPlacement | None = None,
        faults: FaultBook | None = None,
        attribution: Callable[[], Attribution | None] | None = None,
    ) -> None:
        """Register the answers a component gives; each question has one answerer."""
        given = {"pods": pods, "placement": placement, "faults": faults, "attribution": attribution}
        for name, value in given.items():
            if value is None:
                continue
            if getattr(self, f"_{name}") is not None:
                raise RuntimeError(f"{name} is answered twice")
            setattr(self, f"_{name}", value)

    def pod_exists(self, namespace: str, name: str) -> bool | None:
        """Whether kubelet lists the pod; None when nobody knows (no current kubelet answer)."""
        return self._pods.pod_exists(namespace, name) if self._pods is not None else None

    def device_holders(self) -> DeviceListing | None:
        """Every device kubelet lists, with its pod and container, and when kubelet was asked; None: not known."""
        return self._pods.device_holders() if self._pods is not None else None

    def first_card(self, fitting: Sequence[int]) -> int | None:
        """The card to use first among ``fitting`` (the topology's choice); None while no topology is known."""
        return self._placement.first_card(fitting) if self._placement is not None else None

    def out_of_service(self) -> frozenset[int]:
        """Cards kept from new work (``any`` placement, PreferredAllocation): active faults of action reset_gpu or
        stronger, and cards whose driver calls are hung right now."""
        hung = frozenset(self.device.access.hung_cards())
        return gpus_out_of_service(self.active_faults()) | hung

    def active_faults(self) -> Sequence[Fault]:
        return self._faults.active_faults() if self._faults is not None else ()

    def check_states(self) -> Sequence[CheckState]:
        return self._faults.check_states() if self._faults is not None else ()

    def hook_deliveries(self) -> Sequence[HookDelivery]:
        """Each queued fault's state with each hook target: pending, delivered or failing (and why)."""
        return self._faults.hook_deliveries() if self._faults is not None else ()

    def attribution(self) -> Attribution | None:
        """Who each GPU process belongs to, as of the latest Snapshot attributed."""
        return self._attribution() if self._attribution is not None else None

    def status(self) -> NodeStatus:
        """The node's one status (exporter/health.py): cheap and thread-safe, for /healthz, systemd and gRPC."""
        try:
            backlogs = self._faults.backlogs() if self._faults is not None else {}
        except Exception:  # a broken backlog reader must not break /healthz
            log.exception("backlog reader failed")
            backlogs = {}
        access = self.device.access
        return summarize(
            self.sampler.latest(),
            now=self.clock(),
            mono_now=access.now(),
            stale_seconds=self.stale_seconds,
            hung=access.hung(),
            backlogs=backlogs,
            failed_workers=tuple(f.describe(self.workers.now()) for f in self.workers.failing()),
        )


Builder = Callable[[Node], Component | None]  # a component module's build(node); None: not on this node
