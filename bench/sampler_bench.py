"""Sampler cost: CPU time per GPU per cycle, against the same backend calls made directly, as the node grows.

``process_time`` counts every thread of this process, so the sampler's per-GPU worker threads are included (and the
direct loop makes the same calls: sample, processes, mig_instances on MIG cards, profiling). The
simulated backend costs microseconds per call; the difference between the two rows is the sampler's own cost
(threads, deadlines, Snapshot building), which is what grows with the node. On real NVML add the driver's cost
per card (see ``bench/nvml_overhead.py`` and the H200 capture in tests/fixtures/h200).
"""

from __future__ import annotations

import time

from bench.common import BenchArgs, Row
from bench.scenarios import scaled
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings

NAME = "sampler"


def _direct_cpu_per_gpu(sim: SimulatedBackend, cycles: int) -> float:
    gpus = sim.device_count()
    mig = [bool(sim.sample(i).mig_mode_current) for i in range(gpus)]
    start = time.process_time()
    for _ in range(cycles):
        for i in range(gpus):
            sim.sample(i)
            sim.processes(i)
            instances = sim.mig_instances(i) if mig[i] else ()
            sim.profiling(i, instances)
    return (time.process_time() - start) / (cycles * gpus)


def measure(gpus: int, processes_per_gpu: int, cycles: int) -> list[Row]:
    sim = SimulatedBackend(scaled(gpus, processes_per_gpu))
    sim.open()
    sampler = Sampler(sim, SamplerSettings(interval_seconds=5.0, call_deadline_seconds=2.0))
    try:
        sampler.run_once()  # opens the backend, starts the workers, reads device_info once
        direct = _direct_cpu_per_gpu(sim, cycles)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(cycles):
            sampler.run_once()
        cpu = (time.process_time() - cpu0) / (cycles * gpus)
        wall = (time.perf_counter() - wall0) / cycles
    finally:
        sampler.stop()
        sim.close()
    procs = gpus * processes_per_gpu
    return [
        Row("sampler CPU per GPU per cycle", "ms", cpu * 1e3, gpus, procs),
        Row("  same calls made directly", "ms", direct * 1e3, gpus, procs),
        Row("  sampler / direct", "x", cpu / direct if direct > 0 else float("nan"), gpus, procs),
        Row("sampler cycle wall time", "ms", wall * 1e3, gpus, procs),
    ]


def run(args: BenchArgs) -> list[Row]:
    rows: list[Row] = []
    for per_gpu in args.processes_per_gpu:
        for gpus in args.gpu_counts:
            cycles = max(10, args.cycles * 8 // max(gpus, 8))  # keep the 64-GPU points from dominating the run
            rows += measure(gpus, per_gpu, cycles)
    return rows
