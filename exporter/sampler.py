"""Background sampling into immutable Snapshots.

Every driver call goes through the device-access layer (``exporter/backends/{guarded,lanes}.py``): one lane per card, a
deadline on every call. A cycle fans out over the cards in two rounds (identity and sample; then processes and MIG
instances) and waits for each call at most its deadline. A card whose call passes its deadline is marked not fresh
(its last good reading is kept for context); while its lane stays hung, its calls fail at once, so a hung card
costs the cycle nothing after the first deadline and stalls no other card. When the stuck call returns, the card
comes back by itself. A process or MIG listing that fails (but does not hang) only leaves that part unknown.

New Snapshots go to subscribers through a latest-wins bus (``exporter/bus.py``): each runs on its own thread, so
a slow subscriber skips Snapshots instead of delaying sampling. Scrapes read the last Snapshot and never call the
driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import CallTimeoutError, CardHungError, DeviceAccess, Pending
from exporter.backends.protocol import Backend
from exporter.backends.types import (
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    GpuProcess,
    MigInstance,
    PcieThroughput,
    SystemInfo,
    Unknown,
)
from exporter.bus import LatestBus, SubscriberStats
from exporter.settings import option
from exporter.snapshot import GpuSnapshot, Snapshot, StuckCall

log = structlog.get_logger("sampler")


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    """[sampler]: how often the cards are read, and how long a driver call may take (the deadlines are every
    caller's, through the device-access layer: a GuardedBackend made over these settings)."""

    interval_seconds: float = option(5.0, min=0.1, max=3600)
    call_deadline_seconds: float = option(2.0, min=0.05, max=600)  # every driver read, by anyone
    change_deadline_seconds: float = option(20.0, min=0.05, max=600)  # MIG instance create/destroy
    open_deadline_seconds: float = option(10.0, min=0.05, max=600)  # nvmlInit, device count, system info
    # the 2 x 20 ms PCIe rate reading, for cards whose GPM gives no PCIe rates: at most this often
    pcie_throughput_interval_seconds: float = option(30.0, min=1, max=3600)


@dataclass(slots=True)
class _CardCycle:
    """One card's calls in one cycle."""

    index: int
    info: DeviceInfo | None
    info_call: Pending[Any] | None = None
    sample_call: Pending[Any] | None = None
    processes_call: Pending[Any] | None = None
    mig_call: Pending[Any] | None = None
    profiling_call: Pending[Any] | None = None
    pcie_call: Pending[Any] | None = None
    sample: DeviceSample | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    profiling: DeviceProfiling | None = None
    error: BackendError | None = None  # the card failed this cycle (no sample)
    partial: dict[str, str] = field(default_factory=dict)  # part -> why it is unknown (the card is still fresh)


class Sampler:
    """Samples a backend at a fixed interval and publishes Snapshots."""

    def __init__(
        self,
        backend: Backend | GuardedBackend,
        settings: SamplerSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or SamplerSettings()
        if isinstance(backend, GuardedBackend):  # its deadlines are the ones it was made with
            self.device, self._owns_device = backend, False
        else:
            self.device, self._owns_device = GuardedBackend(DeviceAccess(backend, self.settings)), True
        self.backend: Backend = self.device.raw
        self._clock = clock
        self._monotonic = monotonic
        self._count: int | None = None  # cards, once the backend is open
        self._infos: dict[int, DeviceInfo] = {}
        self._pcie: dict[int, tuple[float, PcieThroughput | None]] = {}  # fallback reading: (monotonic read time, it)
        self._gpus: dict[int, GpuSnapshot] = {}
        self._system: SystemInfo | None = None
        self._backend_error: str | None = None
        self._opening: Pending[Any] | None = None  # an open that passed its deadline and has not returned
        self._latest: Snapshot | None = None
        self._latest_lock = threading.Lock()
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bus: LatestBus[Snapshot] = LatestBus()
        self._seq = 0

    # ----- public ------------------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Snapshot], object], name: str | None = None) -> None:
        """Call ``callback`` with new Snapshots on its own thread; a busy callback skips to the newest one."""
        self._bus.subscribe(callback, name)

    def wait_subscribers(self, timeout: float = 10.0) -> bool:
        """Every subscriber has handled the latest Snapshot (tests, benchmarks)."""
        return self._bus.wait_idle(timeout)

    def subscriber_stats(self) -> list[SubscriberStats]:
        return self._bus.stats()

    def latest(self) -> Snapshot | None:
        with self._latest_lock:
            return self._latest

    def wait_first(self, timeout: float | None = None) -> bool:
        return self._first.wait(timeout)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> list[str]:
        """Stop sampling; returns the subscribers still busy after ``timeout`` (they are left to finish)."""
        self._stop.set()
        started = time.monotonic()
        if self._thread is not None:
            self._thread.join(timeout)
        busy = self._bus.close(max(0.0, timeout - (time.monotonic() - started)))
        if self._owns_device:
            self.device.access.shutdown(0.0)
        return busy

    def run_once(self) -> Snapshot:
        """One full cycle on the calling thread's behalf (tests and benchmarks)."""
        started = self._monotonic()
        if self._ensure_open():
            assert self._count is not None
            cycles = [_CardCycle(i, self._infos.get(i)) for i in range(self._count)]
            self._round_one(cycles)
            self._round_two(cycles)
            self._round_three(cycles)
            for cycle in cycles:
                self._absorb(cycle)
        return self._publish(started)

    # ----- internals ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        next_tick = self._monotonic()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the loop must survive anything; the failure shows in the next Snapshot
                log.exception("sampling cycle failed")
            next_tick += self.settings.interval_seconds
            delay = next_tick - self._monotonic()
            if delay < 0:  # fell behind: skip missed ticks rather than burst
                next_tick = self._monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _ensure_open(self) -> bool:
        if self._count is not None:
            return True
        access = self.device.access
        try:
            if self._opening is not None:  # an earlier open is still in the driver: wait for its answer
                if not self._opening.outcome.done():
                    hung = access.lane("node").hung()
                    stuck = f" after {access.now() - hung.since:.0f}s" if hung else ""
                    self._backend_error = f"timeout: backend open has not returned{stuck}"
                    return False
                opening, self._opening = self._opening, None
                opening.outcome.result()
            else:
                pending = access.submit("node", "open", self.backend.open, access.deadlines.open_deadline_seconds)
                try:
                    pending.result()
                except CallTimeoutError:
                    self._opening = pending
                    raise
            self._system = self.device.system_info()
            count = self.device.device_count()
        except BackendError as exc:
            if self._backend_error != f"{exc.code}: {exc}":
                log.error("backend unavailable", backend=self.backend.name, error=str(exc), code=exc.code)
            self._backend_error = f"{exc.code}: {exc}"
            return False
        self._count = count
        self._backend_error = None
        log.info("backend open", backend=self.backend.name, gpus=count, driver=self._system.driver_version)
        return True

    def _round_one(self, cycles: list[_CardCycle]) -> None:
        for c in cycles:
            if c.info is None:
                c.info_call = self.device.submit(c.index, "device_info")
            c.sample_call = self.device.submit(c.index, "sample")
        for c in cycles:
            try:
                if c.info_call is not None:
                    c.info = self._infos[c.index] = c.info_call.result()
                assert c.sample_call is not None
                c.sample = c.sample_call.result()
            except BackendError as exc:
                c.error = exc
            except Exception as exc:  # a backend bug must not kill the cycle; report it as data
                log.exception("backend call raised unexpectedly", gpu=c.index)
                c.error = BackendError(f"{type(exc).__name__}: {exc}", call="unexpected", code="internal")

    def _round_two(self, cycles: list[_CardCycle]) -> None:
        for c in cycles:
            if c.error is not None or c.sample is None:
                continue
            c.processes_call = self.device.submit(c.index, "processes")
            if c.sample.mig_mode_current is True:
                c.mig_call = self.device.submit(c.index, "mig_instances")
        for c in cycles:
            if c.processes_call is not None:
                listed = self._part(c, "processes", c.processes_call, ())
                if isinstance(listed, Unknown):  # the driver answers, but will not list them (no permission)
                    c.partial["processes"] = "unknown: the driver does not list this card's processes to this daemon"
                    listed = ()
                c.processes = listed
            if c.mig_call is not None:
                c.mig_instances = self._part(c, "mig_instances", c.mig_call, ())

    def _round_three(self, cycles: list[_CardCycle]) -> None:
        """Profiling (GPM) over the interval since the last cycle, with this cycle's MIG instances; then, only where
        GPM gives no PCIe rates and at most every ``pcie_throughput_interval_seconds``, the slow PCIe fallback.
        Either failing leaves only its own series out."""
        live = [c for c in cycles if c.error is None and c.sample is not None]
        for c in live:
            c.profiling_call = self.device.submit(c.index, "profiling", c.mig_instances)
        now = self._monotonic()
        for c in live:
            assert c.profiling_call is not None
            c.profiling = self._part(c, "profiling", c.profiling_call, None)
            if c.profiling is not None and c.profiling.pcie_sample is not None:
                self._pcie.pop(c.index, None)
                continue
            read_at, _ = self._pcie.get(c.index, (None, None))
            if c.error is None and (read_at is None or now - read_at >= self.settings.pcie_throughput_interval_seconds):
                c.pcie_call = self.device.submit(c.index, "pcie_throughput")
        for c in live:
            if c.pcie_call is not None:
                self._pcie[c.index] = (now, self._part(c, "pcie_throughput", c.pcie_call, None))

    def _part(self, c: _CardCycle, name: str, call: Pending[Any], unknown: Any) -> Any:
        """A listing that fails leaves that part unknown; one that hangs means the card hangs."""
        try:
            return call.result()
        except (CallTimeoutError, CardHungError) as exc:
            c.error = c.error or exc
        except BackendError as exc:
            c.partial[name] = f"{exc.code}: {exc}"
        except Exception as exc:
            log.exception("backend call raised unexpectedly", gpu=c.index, call=name)
            c.partial[name] = f"internal: {type(exc).__name__}: {exc}"
        return unknown

    def _absorb(self, c: _CardCycle) -> None:
        prev = self._gpus.get(c.index)
        mig_changed = (
            c.sample is not None
            and prev is not None
            and prev.sample is not None
            and prev.sample.mig_mode_current != c.sample.mig_mode_current
        )
        if mig_changed:
            self._infos.pop(c.index, None)  # identity (the minor number) may change with MIG mode: read it again
        if c.error is None and c.sample is not None:
            self._gpus[c.index] = GpuSnapshot(
                index=c.index,
                info=c.info,
                sample=c.sample,
                processes=c.processes,
                mig_instances=c.mig_instances,
                sampled_at=self._clock(),
                fresh=True,
                partial_errors=MappingProxyType(c.partial),
                profiling=c.profiling,
                pcie_throughput=self._pcie.get(c.index, (None, None))[1],
            )
            if prev is not None and not prev.fresh:
                log.info("gpu answering again", gpu=c.index)
            if c.partial and (prev is None or dict(prev.partial_errors) != c.partial):
                log.warning("part of a gpu sample is unknown", gpu=c.index, errors=c.partial)
            return
        err = c.error or BackendError("no sample", code="error")
        code = "timeout" if isinstance(err, (CallTimeoutError, CardHungError)) else err.code
        if isinstance(err, CardHungError):
            message = f"timeout: {err}"
        elif isinstance(err, CallTimeoutError):
            message = f"timeout: {err.call} has not returned ({err})"
        else:
            message = f"{code}: {err.call + ': ' if err.call else ''}{err}"
        if prev is None or prev.error_code != code or (code != "timeout" and prev.error != message):
            log.warning("gpu sample failed", gpu=c.index, error=message)
        base = prev or GpuSnapshot(c.index, c.info, None, (), (), None, False)
        self._gpus[c.index] = replace(base, info=c.info or base.info, fresh=False, error=message, error_code=code)

    def _stuck_calls(self) -> tuple[StuckCall, ...]:
        access = self.device.access
        now = access.now()
        return tuple(StuckCall(str(h.scope), h.call, now - h.since) for h in access.hung())

    def _publish(self, started: float) -> Snapshot:
        self._seq += 1
        snap = Snapshot(
            seq=self._seq,
            taken_at=self._clock(),
            interval_seconds=self.settings.interval_seconds,
            cycle_seconds=self._monotonic() - started,
            backend_name=self.backend.name,
            backend_up=self._count is not None,
            backend_error=self._backend_error,
            system=self._system,
            gpus=tuple(self._gpus[i] for i in sorted(self._gpus)),
            counters=self.device.access.counters(),
            stuck_calls=self._stuck_calls(),
            subscribers=tuple(self._bus.stats()),
        )
        with self._latest_lock:
            self._latest = snap
        self._first.set()
        self._bus.publish(snap)
        return snap
