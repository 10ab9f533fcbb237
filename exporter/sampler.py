"""Background sampling into immutable Snapshots, with a deadline on every backend call.

One worker thread per GPU runs that card's calls in order. The coordinator thread starts a cycle on every idle
worker, then waits for them, watching the call each worker is in: a call that passes its deadline is counted as a
timeout once, the card is marked not fresh, and the coordinator moves on. A stuck worker gets no new work until its
call returns, so a hung card costs one thread and stalls nothing else (scrapes read the last Snapshot and never
call the backend).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TypeVar

import structlog

from exporter.backends.errors import BackendError
from exporter.backends.protocol import Backend
from exporter.backends.types import (
    DeviceInfo,
    DeviceProfiling,
    DeviceSample,
    GpuProcess,
    MigInstance,
    PcieThroughput,
    ProfilingMetric,
    SystemInfo,
)
from exporter.snapshot import CallCounters, GpuSnapshot, Snapshot

T = TypeVar("T")
log = structlog.get_logger("sampler")


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    interval_seconds: float = 5.0
    call_deadline_seconds: float = 2.0
    open_deadline_seconds: float = 10.0
    pcie_throughput_interval_seconds: float = 30.0  # the 2 x 20 ms fallback, for cards whose GPM lacks PCIe rates

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        if self.call_deadline_seconds <= 0:
            raise ValueError("call_deadline_seconds must be > 0")
        if self.pcie_throughput_interval_seconds <= 0:
            raise ValueError("pcie_throughput_interval_seconds must be > 0")


@dataclass(frozen=True, slots=True)
class _CycleResult:
    info: DeviceInfo | None
    sample: DeviceSample | None
    processes: tuple[GpuProcess, ...]
    mig_instances: tuple[MigInstance, ...]
    error: BackendError | None
    finished_at: float
    profiling: DeviceProfiling | None = None
    pcie_throughput: PcieThroughput | None = None


class _CallTimer:
    """What one worker is doing right now, read by the coordinator to enforce deadlines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: str | None = None
        self._started = 0.0
        self.reported_timeout = False

    def begin(self, call: str, now: float) -> None:
        with self._lock:
            self._call, self._started, self.reported_timeout = call, now, False

    def end(self) -> None:
        with self._lock:
            self._call = None

    def current(self) -> tuple[str, float] | None:
        with self._lock:
            return None if self._call is None else (self._call, self._started)


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._timeouts: Counter[str] = Counter()

    def call(self, name: str) -> None:
        with self._lock:
            self._calls[name] += 1

    def error(self, name: str, code: str) -> None:
        with self._lock:
            self._errors[(name, code)] += 1

    def timeout(self, name: str) -> None:
        with self._lock:
            self._timeouts[name] += 1

    def freeze(self) -> CallCounters:
        with self._lock:
            return CallCounters(
                calls=MappingProxyType(dict(self._calls)),
                errors=MappingProxyType(dict(self._errors)),
                timeouts=MappingProxyType(dict(self._timeouts)),
            )


class _GpuWorker:
    """Runs the calls of one card on its own thread."""

    def __init__(
        self,
        index: int,
        backend: Backend,
        counters: _Counters,
        monotonic: Callable[[], float],
        *,
        pcie_every: float = 30.0,
    ) -> None:
        self.index = index
        self.timer = _CallTimer()
        self._backend = backend
        self._counters = counters
        self._monotonic = monotonic
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpu{index}")
        self.future: Future[_CycleResult] | None = None
        self.info: DeviceInfo | None = None
        self.pcie: PcieThroughput | None = None  # last fallback reading, kept between its slow-cadence reads
        self.pcie_read_at: float | None = None
        self.pcie_every = pcie_every

    @property
    def busy(self) -> bool:
        return self.future is not None and not self.future.done()

    def submit(self, clock: Callable[[], float]) -> Future[_CycleResult]:
        self.future = self._pool.submit(self._cycle, clock)
        return self.future

    def _call(self, name: str, fn: Callable[[int], T]) -> T:
        self.timer.begin(name, self._monotonic())
        self._counters.call(name)
        try:
            return fn(self.index)
        except BackendError as exc:
            self._counters.error(name, exc.code)
            raise
        finally:
            self.timer.end()

    def _cycle(self, clock: Callable[[], float]) -> _CycleResult:
        b = self._backend
        info, sample = self.info, None
        processes: tuple[GpuProcess, ...] = ()
        instances: tuple[MigInstance, ...] = ()
        try:
            if info is None:
                info = self.info = self._call("device_info", b.device_info)
            sample = self._call("sample", b.sample)
            processes = self._call("processes", b.processes)
            if sample.mig_mode_current is True:
                instances = self._call("mig_instances", b.mig_instances)
            profiling, pcie = self._profiling(instances)
        except BackendError as exc:
            return _CycleResult(info, None, (), (), exc, clock())
        except Exception as exc:  # a backend bug must not kill the worker; report it as data
            log.exception("backend call raised unexpectedly", gpu=self.index)
            err = BackendError(f"{type(exc).__name__}: {exc}", call="unexpected", code="internal")
            return _CycleResult(info, None, (), (), err, clock())
        return _CycleResult(info, sample, processes, instances, None, clock(), profiling, pcie)

    # --- profiling (GPM) and the PCIe throughput fallback -------------------------------------------------------
    # One more call per card per cycle (``profiling``), and ``pcie_throughput`` every ``pcie_every`` seconds
    # only where the card's GPM gives no PCIe rates. A failure of either degrades only its own series: it is
    # counted in xpu_backend_call_errors_total and the rest of the card's sample stands.

    def _profiling(self, instances: tuple[MigInstance, ...]) -> tuple[DeviceProfiling | None, PcieThroughput | None]:
        profiling: DeviceProfiling | None = None
        with contextlib.suppress(BackendError):
            profiling = self._call("profiling", lambda index: self._backend.profiling(index, instances))
        card = profiling.card if profiling is not None else None
        if card is not None and ProfilingMetric.PCIE_TX_BYTES_PER_SECOND in card.metrics:
            self.pcie, self.pcie_read_at = None, None
            return profiling, None
        now = self._monotonic()
        if self.pcie_read_at is None or now - self.pcie_read_at >= self.pcie_every:
            self.pcie_read_at = now
            try:
                self.pcie = self._call("pcie_throughput", self._backend.pcie_throughput)
            except BackendError:
                self.pcie = None
        return profiling, self.pcie

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Sampler:
    """Samples a backend at a fixed interval and publishes Snapshots."""

    def __init__(
        self,
        backend: Backend,
        config: SamplerConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.config = config or SamplerConfig()
        self._clock = clock
        self._monotonic = monotonic
        self._counters = _Counters()
        self._workers: list[_GpuWorker] = []
        self._gpus: dict[int, GpuSnapshot] = {}
        self._system: SystemInfo | None = None
        self._backend_error: str | None = None
        self._open_future: Future[None] | None = None
        self._open_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend-open")
        self._latest: Snapshot | None = None
        self._latest_lock = threading.Lock()
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribers: list[Callable[[Snapshot], object]] = []
        self._seq = 0

    # ----- public ------------------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Snapshot], object]) -> None:
        """Call ``callback`` with every new Snapshot, on the sampler thread; it must return quickly."""
        self._subscribers.append(callback)

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

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for w in self._workers:
            w.shutdown()
        self._open_pool.shutdown(wait=False, cancel_futures=True)

    def run_once(self) -> Snapshot:
        """One full cycle on the calling thread's behalf (tests and benchmarks)."""
        started = self._monotonic()
        if not self._ensure_open():
            return self._publish(started)
        pending = [w.submit(self._clock) for w in self._workers if not w.busy]
        self._await(pending, started)
        return self._publish(started)

    # ----- internals ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        next_tick = self._monotonic()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the loop must survive anything; the failure shows in the next Snapshot
                log.exception("sampling cycle failed")
            next_tick += self.config.interval_seconds
            delay = next_tick - self._monotonic()
            if delay < 0:  # fell behind: skip missed ticks rather than burst
                next_tick = self._monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _ensure_open(self) -> bool:
        if self._workers:
            return True
        if self._open_future is None:
            self._open_future = self._open_pool.submit(self._open_backend)
        try:
            self._open_future.result(timeout=self.config.open_deadline_seconds)
        except TimeoutError:
            self._backend_error = f"timeout: backend open exceeded {self.config.open_deadline_seconds:g}s"
            self._counters.timeout("open")
            return False
        except BackendError as exc:
            self._open_future = None
            self._counters.error("open", exc.code)
            if self._backend_error != str(exc):
                log.error("backend unavailable", backend=self.backend.name, error=str(exc), code=exc.code)
            self._backend_error = f"{exc.code}: {exc}"
            return False
        self._open_future = None
        return True

    def _open_backend(self) -> None:
        self.backend.open()
        self._system = self.backend.system_info()
        count = self.backend.device_count()
        every = self.config.pcie_throughput_interval_seconds
        self._workers = [
            _GpuWorker(i, self.backend, self._counters, self._monotonic, pcie_every=every) for i in range(count)
        ]
        self._backend_error = None
        log.info("backend open", backend=self.backend.name, gpus=count, driver=self._system.driver_version)

    def _await(self, pending: list[Future[_CycleResult]], started: float) -> None:
        deadline = self.config.call_deadline_seconds
        give_up_at = started + max(self.config.interval_seconds, deadline)
        waiting = {w for w in self._workers if w.future in pending}
        while waiting:
            now = self._monotonic()
            in_flight = [(w, w.timer.current()) for w in waiting]
            next_expiry = min((c[1] + deadline for _, c in in_flight if c is not None), default=now + 0.01)
            wait(
                [w.future for w in waiting if w.future is not None],
                timeout=max(0.0, min(next_expiry, give_up_at) - now),
                return_when=FIRST_COMPLETED,
            )
            now = self._monotonic()
            for w in list(waiting):
                if w.future is not None and w.future.done():
                    self._absorb(w, w.future.result())
                    waiting.discard(w)
                    continue
                current = w.timer.current()
                if current is not None and now - current[1] >= deadline:
                    self._mark_stuck(w, current[0], now - current[1])
                    waiting.discard(w)
                elif now >= give_up_at:
                    self._mark_stuck(w, current[0] if current else "cycle", now - started)
                    waiting.discard(w)
        # workers left busy from earlier cycles: keep their card marked stuck and count each hung call once
        for w in self._workers:
            if w.busy and w.future not in pending:
                current = w.timer.current()
                if current is not None:
                    self._mark_stuck(w, current[0], self._monotonic() - current[1])

    def _mark_stuck(self, w: _GpuWorker, call: str, elapsed: float) -> None:
        if not w.timer.reported_timeout:
            w.timer.reported_timeout = True
            self._counters.timeout(call)
            log.warning("backend call exceeded its deadline", gpu=w.index, call=call, seconds=round(elapsed, 3))
        prev = self._gpus.get(w.index) or GpuSnapshot(w.index, w.info, None, (), (), None, False)
        self._gpus[w.index] = replace(
            prev,
            info=prev.info or w.info,
            fresh=False,
            error=f"timeout: {call} has not returned after {elapsed:.1f}s "
            f"(deadline {self.config.call_deadline_seconds:g}s)",
            error_code="timeout",
        )

    def _absorb(self, w: _GpuWorker, result: _CycleResult) -> None:
        prev = self._gpus.get(w.index)
        if result.error is None and result.sample is not None:
            self._gpus[w.index] = GpuSnapshot(
                index=w.index,
                info=result.info,
                sample=result.sample,
                processes=result.processes,
                mig_instances=result.mig_instances,
                sampled_at=result.finished_at,
                fresh=True,
                profiling=result.profiling,
                pcie_throughput=result.pcie_throughput,
            )
            if prev is not None and not prev.fresh:
                log.info("gpu answering again", gpu=w.index)
            return
        err = result.error
        code = err.code if err else "error"
        message = f"{code}: {err.call + ': ' if err and err.call else ''}{err}"
        if prev is None or prev.error != message:
            log.warning("gpu sample failed", gpu=w.index, error=message)
        self._gpus[w.index] = GpuSnapshot(
            index=w.index,
            info=result.info or (prev.info if prev else None),
            sample=prev.sample if prev else None,
            processes=prev.processes if prev else (),
            mig_instances=prev.mig_instances if prev else (),
            sampled_at=prev.sampled_at if prev else None,
            fresh=False,
            error=message,
            error_code=code,
            profiling=prev.profiling if prev else None,
            pcie_throughput=prev.pcie_throughput if prev else None,
        )

    def _publish(self, started: float) -> Snapshot:
        self._seq += 1
        snap = Snapshot(
            seq=self._seq,
            taken_at=self._clock(),
            interval_seconds=self.config.interval_seconds,
            cycle_seconds=self._monotonic() - started,
            backend_name=self.backend.name,
            backend_up=bool(self._workers),
            backend_error=self._backend_error,
            system=self._system,
            gpus=tuple(self._gpus[i] for i in sorted(self._gpus)),
            counters=self._counters.freeze(),
        )
        with self._latest_lock:
            self._latest = snap
        self._first.set()
        for callback in self._subscribers:
            try:
                callback(snap)
            except Exception:
                log.exception("snapshot subscriber failed")
        return snap
