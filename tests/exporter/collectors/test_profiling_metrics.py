"""Profiling (GPM) and PCIe rate series from the sampler's Snapshots of the simulated node.

Covers: series for every card and MIG instance of h200x8, consistency with utilization, absence (never 0) when a
card has no GPM or no interval yet, the PCIe throughput fallback and its slow cadence, and that a failing
profiling call degrades only the profiling series.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.errors import BackendError
from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.backends.types import DeviceProfiling, MigInstance
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from tests.exporter.collectors.test_card_metrics import samples
from tests.support.clock import FakeClock

CONFIG = SamplerSettings(interval_seconds=5.0, call_deadline_seconds=2.0, pcie_throughput_interval_seconds=30.0)
CARD_SERIES = (
    "xpu_gpu_graphics_engine_active_ratio",
    "xpu_gpu_sm_active_ratio",
    "xpu_gpu_sm_occupancy_ratio",
    "xpu_gpu_tensor_active_ratio",
    "xpu_gpu_dram_active_ratio",
    "xpu_gpu_pipe_active_ratio",
)
MIG_SERIES = tuple(name.replace("xpu_gpu_", "xpu_mig_") for name in CARD_SERIES)


Parsed = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def render(snapshot: Snapshot) -> Parsed:
    """The exposition of the default collectors, parsed once (by prometheus_client's own parser)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, default_collectors(), clock=lambda: snapshot.taken_at))
    return samples(generate_latest(registry).decode())


def value(parsed: Parsed, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    return next((v for (n, ls), v in parsed.items() if n == name and want <= set(ls)), None)


def names(parsed: Parsed) -> set[str]:
    return {n for n, _ in parsed}


def cycles(sampler: Sampler, clock: FakeClock, count: int, step: float = 5.0) -> Snapshot:
    snap = sampler.run_once()
    for _ in range(count - 1):
        clock.advance(step)
        snap = sampler.run_once()
    return snap


@pytest.fixture
def sampler(sim: SimulatedBackend, clock: FakeClock) -> Iterator[Sampler]:
    # one clock for the sampler's wall time, its monotonic time and the simulated node
    s = Sampler(sim, CONFIG, clock=clock, monotonic=clock)
    yield s
    s.stop()


def test_every_card_and_mig_instance_of_h200x8_has_profiling_series(sampler: Sampler, clock: FakeClock) -> None:
    snap = cycles(sampler, clock, 2)
    text = render(snap)
    for gpu in snap.gpus:
        for name in CARD_SERIES:
            assert value(text, name, gpu=str(gpu.index), uuid=gpu.uuid) is not None, (name, gpu.index)
        for inst in gpu.mig_instances:
            for name in MIG_SERIES:
                where = {"gpu": str(gpu.index), "gpu_instance_id": str(inst.gpu_instance_id)}
                assert value(text, name, **where) is not None, (name, where)
    assert sum(len(g.mig_instances) for g in snap.gpus) == 2, "h200x8 has two MIG instances on GPU 7"


def test_no_series_before_the_first_interval_closes(sampler: Sampler, clock: FakeClock) -> None:
    text = render(sampler.run_once())
    for name in (*CARD_SERIES, *MIG_SERIES):
        assert name not in names(text), f"{name} before two samples bracket an interval (it must be absent, not 0)"
    assert value(text, "xpu_gpu_profiling_supported", gpu="0") == 1.0


def test_profiling_agrees_with_utilization(sampler: Sampler, clock: FakeClock) -> None:
    text = render(cycles(sampler, clock, 3))
    for gpu in range(6):  # MIG off: the card reports utilization
        util = value(text, "xpu_gpu_utilization_ratio", gpu=str(gpu))
        memory = value(text, "xpu_gpu_memory_utilization_ratio", gpu=str(gpu))
        graphics = value(text, "xpu_gpu_graphics_engine_active_ratio", gpu=str(gpu))
        sm = value(text, "xpu_gpu_sm_active_ratio", gpu=str(gpu))
        occupancy = value(text, "xpu_gpu_sm_occupancy_ratio", gpu=str(gpu))
        tensor = value(text, "xpu_gpu_tensor_active_ratio", gpu=str(gpu), pipe="any")
        dram = value(text, "xpu_gpu_dram_active_ratio", gpu=str(gpu))
        assert None not in (util, memory, graphics, sm, occupancy, tensor, dram)
        assert graphics == pytest.approx(util, abs=1e-3)
        assert dram == pytest.approx(memory, abs=1e-3)
        assert occupancy <= sm <= graphics  # type: ignore[operator]
        assert tensor <= sm  # type: ignore[operator]
    busy, idle = value(text, "xpu_gpu_sm_active_ratio", gpu="0"), value(text, "xpu_gpu_sm_active_ratio", gpu="6")
    assert busy is not None and busy > 0.5 and idle == 0.0


def test_mig_card_is_the_sm_weighted_mean_of_its_instances(sampler: Sampler, clock: FakeClock) -> None:
    snap = cycles(sampler, clock, 2)
    text = render(snap)
    gpu7 = snap.gpu(7)
    assert gpu7 is not None
    weighted = sum(
        (value(text, "xpu_mig_sm_active_ratio", gpu="7", gpu_instance_id=str(m.gpu_instance_id)) or 0.0) * m.sm_count
        for m in gpu7.mig_instances
    )
    assert value(text, "xpu_gpu_sm_active_ratio", gpu="7") == pytest.approx(weighted / 132, abs=1e-3)
    assert value(text, "xpu_gpu_utilization_ratio", gpu="7") is None, "MIG on: only profiling shows activity"


def test_pcie_rates_come_from_gpm_and_the_slow_call_stops(sampler: Sampler, clock: FakeClock) -> None:
    snap = cycles(sampler, clock, 4)
    text = render(snap)
    for gpu in range(8):
        assert value(text, "xpu_gpu_pcie_throughput_source", gpu=str(gpu), source="gpm") == 1.0
        assert value(text, "xpu_gpu_pcie_transmit_bytes_per_second", gpu=str(gpu)) is not None
    assert snap.counters.calls["pcie_throughput"] == 8, "only the first cycle, before GPM's first interval closed"
    assert value(text, "xpu_gpu_pcie_transmit_bytes_total") is None, "the wrapping 32-bit byte counters are gone"


def test_without_gpm_pcie_falls_back_to_the_sampling_window_every_30s(clock: FakeClock) -> None:
    backend = SimulatedBackend(load_scenario("h200x8"), clock=clock, gpm=False)
    backend.open()
    sampler = Sampler(backend, CONFIG, clock=clock, monotonic=clock)
    try:
        snap = cycles(sampler, clock, 13)  # 60 s at 5 s
        text = render(snap)
        assert snap.counters.calls["pcie_throughput"] == 8 * 3, "at 0, 30 and 60 s: one read per card each time"
        assert snap.counters.calls["profiling"] == 8 * 13
        for gpu in range(8):
            assert value(text, "xpu_gpu_profiling_supported", gpu=str(gpu)) == 0.0
            assert value(text, "xpu_gpu_pcie_throughput_source", gpu=str(gpu), source="sampling_window") == 1.0
            rx = value(text, "xpu_gpu_pcie_receive_bytes_per_second", gpu=str(gpu))
            assert rx is not None and rx > 0
        for name in (*CARD_SERIES, *MIG_SERIES):
            assert name not in names(text), f"{name} on a card without GPM"
    finally:
        sampler.stop()


class FailingProfiling(SimulatedBackend):
    def profiling(self, index: int, mig_instances: tuple[MigInstance, ...] = ()) -> DeviceProfiling:
        if index == 2:
            raise BackendError("nvmlGpmMetricsGet failed: Unknown", call="nvmlGpmMetricsGet", code="error")
        return super().profiling(index, mig_instances)


def test_a_failing_profiling_call_degrades_only_profiling(clock: FakeClock) -> None:
    backend = FailingProfiling(load_scenario("h200x8"), clock=clock)
    backend.open()
    sampler = Sampler(backend, CONFIG, clock=clock, monotonic=clock)
    try:
        snap = cycles(sampler, clock, 2)
    finally:
        sampler.stop()
    card = snap.gpu(2)
    assert card is not None and card.fresh and card.sample is not None, "the card's sample stands"
    assert card.profiling is None
    assert snap.counters.errors[("profiling", "error")] == 2
    text = render(snap)
    assert value(text, "xpu_gpu_power_watts", gpu="2") is not None
    assert value(text, "xpu_gpu_sm_active_ratio", gpu="2") is None
    assert value(text, "xpu_gpu_sm_active_ratio", gpu="3") is not None
    rates = value(text, "xpu_gpu_pcie_throughput_source", gpu="2", source="sampling_window")
    assert rates == 1.0, "PCIe falls back to the slow call when profiling fails"


def test_a_hung_profiling_call_is_a_timeout_of_that_call(sim: SimulatedBackend, clock: FakeClock) -> None:
    fast = SamplerSettings(interval_seconds=0.2, call_deadline_seconds=0.15)
    sampler = Sampler(sim, fast, clock=clock)
    try:
        sampler.run_once()
        sim.inject("hang", 4, {"call": "profiling"})
        snap = sampler.run_once()
        stuck = snap.gpu(4)
        assert stuck is not None and not stuck.fresh and stuck.error_code == "timeout"
        assert snap.counters.timeouts == {"profiling": 1}
        assert all(g.fresh for g in snap.gpus if g.index != 4)
    finally:
        sim.clear()
        sampler.stop()


def test_profiling_series_samples_are_in_range(sampler: Sampler, clock: FakeClock) -> None:
    for (name, _labels), v in render(cycles(sampler, clock, 2)).items():
        if name.endswith(("_active_ratio", "_occupancy_ratio")):
            assert 0.0 <= v <= 1.0, (name, v)
