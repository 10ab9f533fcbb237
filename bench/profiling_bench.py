"""Profiling (GPM) cost: what the one extra backend call per card per cycle costs, and what its series cost a scrape.

Rows:
- the NVML path's own Python work per card and cycle (``NvmlProfiling.read``: building the 477-slot
  ``nvmlGpmMetricsGet_t`` request, reading ~45 results), with pynvml's GPM calls answered by stubs that do no
  work: what the backend adds on top of the driver. The driver's share (``nvmlGpmSampleGet``,
  ``nvmlGpmMetricsGet``) is measured on a real card by bench/gpm_check.py (bench/device_check.sh);
- the same call per card and MIG instance on the simulated backend;
- the profiling collector's render time and series per scrape as the node grows.

The budget it is judged against: the sampler spends about 4-5 ms of driver time per card per 5 s cycle on an H200
(README); the profiling call should stay a small fraction of that.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pynvml
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from bench.common import BenchArgs, Row, median
from bench.scenarios import scaled
from exporter.backends.nvml.profiling import NvmlProfiling
from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, SnapshotExporter, default_collectors
from exporter.collectors.profiling import ProfilingCollector
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot

NAME = "profiling"


@contextmanager
def stub_gpm() -> Iterator[None]:
    """pynvml's GPM and codec calls answered at once (no driver): only the backend's own work is left to time."""

    def support(_handle: Any) -> Any:
        answer = pynvml.c_nvmlGpmSupport_t()
        answer.isSupportedDevice = 1
        return answer

    def metrics(request: Any) -> Any:
        for slot in range(int(request.numMetrics)):
            request.metrics[slot].nvmlReturn = pynvml.NVML_SUCCESS
            request.metrics[slot].value = 12.5
        return request

    stubs = {
        "nvmlGpmQueryDeviceSupport": support,
        "nvmlGpmSampleAlloc": lambda: ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlGpmSample_t),
        "nvmlGpmSampleFree": lambda _sample: None,
        "nvmlGpmSampleGet": lambda _handle, sample: sample,
        "nvmlGpmMigSampleGet": lambda _handle, _gi, sample: sample,
        "nvmlGpmMetricsGet": metrics,
        "nvmlDeviceGetEncoderUtilization": lambda _handle: [0, 100000],
        "nvmlDeviceGetDecoderUtilization": lambda _handle: [0, 100000],
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,  # R580: the metric ids its nvml.h defines
    }
    originals = {name: getattr(pynvml, name, None) for name in stubs}
    for name, fn in stubs.items():
        setattr(pynvml, name, fn)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(pynvml, name, fn)


def nvml_python_cost(reps: int) -> float:
    """CPU seconds of one ``NvmlProfiling.read`` (card only), driver calls stubbed."""

    clock = [0.0]
    profiling = NvmlProfiling(monotonic=lambda: clock[0])
    times = []
    with stub_gpm():
        profiling.read(0, None, ())
        for _ in range(reps):
            clock[0] += 5.0
            start = time.process_time()
            reading = profiling.read(0, None, ())
            times.append(time.process_time() - start)
            assert reading.card is not None
            assert reading.card.metrics
        profiling.forget()
    return median(times)


def simulated_cost(reps: int) -> tuple[float, int]:
    """CPU seconds per call of the simulated backend's profiling, over every card of h200x8 (MIG included)."""
    clock = [1000.0]
    sim = SimulatedBackend(load_scenario("h200x8"), clock=lambda: clock[0])
    sim.open()
    instances = {i: sim.mig_instances(i) for i in range(sim.device_count())}
    for i in range(sim.device_count()):
        sim.profiling(i, instances[i])
    start = time.process_time()
    for _ in range(reps):
        clock[0] += 5.0
        for i in range(sim.device_count()):
            sim.profiling(i, instances[i])
    calls = reps * sim.device_count()
    return (time.process_time() - start) / calls, sum(len(m) for m in instances.values())


def _registry(snapshot: Snapshot, collectors: list[Collector]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, collectors, clock=lambda: snapshot.taken_at))
    return registry


def render_cost(gpus: int, scrapes: int) -> dict[str, float]:
    """Render time of the profiling collector alone, and of the default collectors with and without it (interleaved,
    so a busy machine weighs on both alike); series and bytes of the profiling collector alone."""
    clock = [1000.0]
    sim = SimulatedBackend(scaled(gpus, 1), clock=lambda: clock[0])
    sim.open()
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5.0, call_deadline_seconds=2.0), clock=lambda: clock[0])
    try:
        sampler.run_once()
        clock[0] += 5.0
        snapshot = sampler.run_once()
    finally:
        sampler.stop()
    alone = _registry(snapshot, [ProfilingCollector()])
    without = _registry(snapshot, [c for c in default_collectors() if c.name != ProfilingCollector.name])
    with_it = _registry(snapshot, default_collectors())
    times: dict[str, list[float]] = {"alone": [], "without": [], "with": []}
    for _ in range(scrapes):
        for key, registry in (("alone", alone), ("without", without), ("with", with_it)):
            start = time.perf_counter()
            generate_latest(registry)
            times[key].append(time.perf_counter() - start)
    body = generate_latest(alone).decode()
    series = sum(1 for line in body.splitlines() if line.startswith("xpu_") and "collector" not in line)
    return {**{key: median(values) for key, values in times.items()}, "series": series, "bytes": len(body)}


def run(args: BenchArgs) -> list[Row]:
    reps = 200 if args.quick else 1000
    rows = [Row("profiling read, NVML path Python only, per card", "ms", nvml_python_cost(reps) * 1e3, 1)]
    per_call, instances = simulated_cost(max(20, reps // 10))
    rows.append(Row("profiling call, simulated backend, per card", "ms", per_call * 1e3, 8, note=f"{instances} MIG"))
    scrapes = 20 if args.quick else 100
    for gpus in args.gpu_counts:
        cost = render_cost(gpus, scrapes)
        rows += [
            Row("profiling collector alone, render per scrape", "ms", cost["alone"] * 1e3, gpus),
            Row("default collectors without profiling, render", "ms", cost["without"] * 1e3, gpus),
            Row("default collectors with profiling, render", "ms", cost["with"] * 1e3, gpus),
            Row("profiling series per scrape", "series", cost["series"], gpus),
            Row("profiling series bytes per scrape", "KiB", cost["bytes"] / 1024, gpus),
        ]
    return rows
