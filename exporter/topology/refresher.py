"""Collect the topology off the request path, with deadlines, and keep the last good one.

Topology changes only with a reboot or hotplug, so it is read at start and then rarely (``refresh_seconds``). The
NVLink reads go through the device-access layer (one lane per card, a deadline on each call): the real H200 hung
for more than 100 s in an NVML topology call. A card whose read does not return, or whose lane is stuck in another
call, gets unknown NVLink peers and a warning. The whole collection runs on its own thread with an overall deadline;
requests and scrapes only ever read the cached result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import CallTimeoutError, CardHungError, Pending
from exporter.backends.types import UNSUPPORTED, Unsupported
from exporter.executor import SerialExecutor
from exporter.snapshot import Snapshot
from exporter.topology.discover import GpuIdentity, read_topology
from exporter.topology.model import Topology
from exporter.topology.settings import TopologySettings
from exporter.topology.sysfs import Sysfs

log = structlog.get_logger("topology")
RETRY_SECONDS = 10.0  # until a topology with every card and every card's NVLink peers exists


@dataclass(frozen=True, slots=True)
class RefreshStatus:
    attempts: int
    failures: int
    timeouts: int
    last_error: str | None
    last_success_at: float | None


class TopologyRefresher:
    def __init__(
        self,
        device: GuardedBackend,
        snapshot: Callable[[], Snapshot | None],
        settings: TopologySettings | None = None,
        *,
        sysfs_root: Path = Path("/sys"),
        clock: Callable[[], float] = time.time,
        on_update: Callable[[Topology], None] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self._device = device
        self._snapshot = snapshot
        self.settings = settings or TopologySettings()
        self._sysfs_root = sysfs_root
        self._clock = clock
        self._on_update = on_update
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._latest: Topology | None = None
        self._attempts = self._failures = self._timeouts = 0
        self._last_error: str | None = None
        self._last_success: float | None = None
        self._collecting: Future[Topology] | None = None
        # one collection at a time, on a daemon thread: a stuck sysfs read must not hold up the daemon's exit
        self._collector = SerialExecutor("topology-collect")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> Topology | None:
        with self._lock:
            return self._latest

    def status(self) -> RefreshStatus:
        with self._lock:
            return RefreshStatus(self._attempts, self._failures, self._timeouts, self._last_error, self._last_success)

    def refresh(self) -> Topology | None:
        """Collect now (or join a collection under way) and wait at most the deadline; the cached result after."""
        snap = self._snapshot()
        identities = _identities(snap)
        if snap is None or not snap.backend_up or identities is None:
            self._record_error("GPU inventory not known yet (no card has answered its inventory call)")
            return self.latest()
        with self._lock:
            self._attempts += 1
            if self._collecting is None or self._collecting.done():
                missing = tuple(g.index for g in snap.gpus if g.info is None)
                self._collecting = self._collector.submit(self._collect, identities, missing)
            future = self._collecting
        try:
            topology = future.result(timeout=self.settings.deadline_seconds)
        except FutureTimeout:
            with self._lock:
                self._timeouts += 1
            self._record_error(f"timeout: topology collection exceeded {self.settings.deadline_seconds:g}s")
            return self.latest()
        except Exception as exc:  # sysfs layout surprises must not take the daemon down
            log.exception("topology collection failed")
            self._record_error(f"{type(exc).__name__}: {exc}")
            return self.latest()
        with self._lock:
            self._latest = topology
            self._last_error = None
            self._last_success = topology.collected_at
        if self._on_update is not None:
            try:
                self._on_update(topology)
            except Exception:
                log.exception("topology update hook failed")
        return topology

    def start(self, first_wait: Callable[[float], bool] | None = None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(first_wait,), name="topology-refresh", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._collector.shutdown(wait=False)  # a collection still in the driver is left to finish on its own

    def _run(self, first_wait: Callable[[float], bool] | None) -> None:
        if first_wait is not None:
            first_wait(30.0)
        while not self._stop.is_set():
            topology = self.refresh()
            # retry soon until every card is in with its NVLink peers read, then rarely: a card whose peers timed
            # out would otherwise read SYS instead of NV18 (and place partitions and label the node so) for an hour
            snap = self._snapshot()
            complete = (
                topology is not None
                and not topology.unread
                and snap is not None
                and len(topology.gpus) == len(snap.gpus)
            )
            self._stop.wait(self.settings.refresh_seconds if complete else self._retry_seconds)

    def _record_error(self, message: str) -> None:
        with self._lock:
            self._failures += 1
            changed = self._last_error != message
            self._last_error = message
        if changed:
            log.warning("topology not collected", error=message)

    def _collect(self, identities: tuple[GpuIdentity, ...], missing: tuple[int, ...] = ()) -> Topology:
        warnings = [f"GPU {i}: inventory not known yet (driver calls not answered); left out" for i in missing]
        reads: dict[int, Pending[Any]] = {
            ident.index: self._device.submit(ident.index, "nvlink_peers") for ident in identities
        }
        peers: dict[int, tuple[str, ...] | None] = {}
        unread = list(missing)
        for index, read in reads.items():
            try:
                result = read.result()
            except CardHungError as exc:
                warnings.append(f"GPU {index}: not answering ({exc.stuck_call} stuck); NVLink peers unknown")
                unread.append(index)
                continue
            except CallTimeoutError as exc:
                warnings.append(f"GPU {index}: nvlink_peers did not return ({exc}); peers unknown")
                unread.append(index)
                continue
            except BackendError as exc:
                warnings.append(f"GPU {index}: nvlink_peers failed: {exc}")
                unread.append(index)
                continue
            peers[index] = None if result is UNSUPPORTED else tuple(result)
        topology = read_topology(Sysfs(str(self._sysfs_root)), identities, peers, collected_at=self._clock())
        if warnings or unread:
            topology = replace(topology, warnings=(*warnings, *topology.warnings), unread=tuple(sorted(unread)))
        return topology


def _serial(serial: str | Unsupported) -> str:
    return "" if isinstance(serial, Unsupported) else serial


def _identities(snap: Snapshot | None) -> tuple[GpuIdentity, ...] | None:
    """The cards whose inventory is known; None when none is (a card stuck since start is left out for now)."""
    if snap is None:
        return None
    out = tuple(
        GpuIdentity(g.index, g.info.uuid, g.info.name, g.info.pci_bus_id, _serial(g.info.serial))
        for g in snap.gpus
        if g.info is not None
    )
    return out or None
