"""Card, MIG and self metrics rendered from real Snapshots of the simulated node."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from tests.support.clock import FakeClock

CONFIG = SamplerSettings(interval_seconds=1.0, call_deadline_seconds=0.2)


def render(snapshot: Snapshot | None, now: float) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, default_collectors(), clock=lambda: now))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    want = tuple(sorted(labels.items()))
    for (n, ls), v in samples(text).items():
        if n == name and all(item in ls for item in want):
            return v
    return None


def names(text: str) -> set[str]:
    return {n for n, _ in samples(text)}


@pytest.fixture
def snapshot(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    clock.advance(10)
    snap = s.run_once()
    s.stop()
    return snap


def test_every_gpu_is_exported_with_identity(snapshot: Snapshot, clock: FakeClock) -> None:
    text = render(snapshot, clock.now)
    infos = [ls for (n, ls) in samples(text) if n == "xpu_gpu_info"]
    assert len(infos) == 8
    assert value(text, "xpu_gpu_info", gpu="3", pci_bus_id="00000000:5D:00.0", model="NVIDIA H200") == 1
    assert value(text, "xpu_gpus") == 8


def test_values_are_in_base_units(snapshot: Snapshot, clock: FakeClock) -> None:
    text = render(snapshot, clock.now)
    g0 = snapshot.gpu(0)
    assert g0 is not None and g0.sample is not None
    assert value(text, "xpu_gpu_sm_clock_hertz", gpu="0") == g0.sample.sm_clock_mhz * 1e6  # type: ignore[operator]
    assert value(text, "xpu_gpu_sm_clock_max_hertz", gpu="0") == 1.98e9
    util = value(text, "xpu_gpu_utilization_ratio", gpu="0")
    assert util is not None and 0.5 < util <= 1.0
    assert value(text, "xpu_gpu_energy_joules_total", gpu="0") == pytest.approx(g0.sample.energy_joules)
    assert value(text, "xpu_gpu_memory_total_bytes", gpu="0") == 150754820096


def test_energy_counter_grows_with_time(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    clock.advance(60)
    first = value(render(s.run_once(), clock.now), "xpu_gpu_energy_joules_total", gpu="0")
    clock.advance(60)
    second = value(render(s.run_once(), clock.now), "xpu_gpu_energy_joules_total", gpu="0")
    s.stop()
    assert first is not None and second is not None
    # ~600 W for 60 s: tens of kJ, not zero and not absurd
    assert 10_000 < second - first < 60 * 700


def test_unsupported_values_are_omitted_not_zero(clock: FakeClock) -> None:
    sim = SimulatedBackend.from_name("h200x1", clock=clock)
    sim.open()
    s = Sampler(sim, CONFIG, clock=clock)
    text = render(s.run_once(), clock.now)
    s.stop()
    assert value(text, "xpu_gpu_up", gpu="0") == 1
    assert "xpu_gpu_nvlink_up" not in names(text), "a card without NVLink exports no NVLink series"
    assert "xpu_gpu_nvlink_crc_errors_total" not in names(text)


def test_mig_instances_are_exported_and_utilization_is_not(snapshot: Snapshot, clock: FakeClock) -> None:
    text = render(snapshot, clock.now)
    mig = [dict(ls) for (n, ls) in samples(text) if n == "xpu_mig_instance_info"]
    assert sorted((m["gpu"], m["profile"]) for m in mig) == [("7", "2g.35gb"), ("7", "3g.71gb")]
    assert value(text, "xpu_mig_memory_used_bytes", gpu="7", gpu_instance_id="1") == 9216 * 2**20
    assert value(text, "xpu_gpu_utilization_ratio", gpu="7") is None, "NVML reports no utilization with MIG on"
    assert value(text, "xpu_gpu_mig_mode_enabled", gpu="7") == 1


def test_stuck_card_keeps_identity_but_drops_values(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    s.run_once()
    sim.inject("hang", 4, {"call": "sample"})
    snap = s.run_once()
    text = render(snap, clock.now)
    sim.clear()
    s.stop()
    assert value(text, "xpu_gpu_up", gpu="4") == 0
    assert value(text, "xpu_gpu_info", gpu="4") == 1
    assert value(text, "xpu_gpu_temperature_celsius", gpu="4") is None, "no stale values passed off as current"
    assert value(text, "xpu_gpu_temperature_celsius", gpu="5") is not None
    assert value(text, "xpu_gpu_sample_failure", gpu="4", code="timeout") == 1
    assert value(text, "xpu_backend_call_timeouts_total", call="sample") == 1


def test_injected_faults_show_in_counters(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, CONFIG, clock=clock)
    sim.inject("ecc", 1, {"corrected": "5", "uncorrected": "1"})
    sim.inject("nvlink_down", 2, {"link": "7"})
    sim.inject("remap_pending", 3)
    sim.inject("compute_mode", 6, {"mode": "exclusive_process"})
    text = render(s.run_once(), clock.now)
    s.stop()
    assert value(text, "xpu_gpu_ecc_volatile_errors_total", gpu="1", kind="corrected") == 5
    assert value(text, "xpu_gpu_ecc_volatile_errors_total", gpu="1", kind="uncorrected") == 1
    assert value(text, "xpu_gpu_nvlink_up", gpu="2", link="7") == 0
    assert value(text, "xpu_gpu_nvlink_up", gpu="2", link="6") == 1
    assert value(text, "xpu_gpu_row_remap_pending", gpu="3") == 1
    assert value(text, "xpu_gpu_compute_mode", gpu="6", mode="exclusive_process") == 1
    assert value(text, "xpu_gpu_compute_mode", gpu="6", mode="default") == 0


def test_collector_self_metrics(snapshot: Snapshot, clock: FakeClock) -> None:
    text = render(snapshot, clock.now + 3)
    for collector in ("card", "mig", "self"):
        assert value(text, "xpu_collector_success", collector=collector) == 1
    assert value(text, "xpu_sample_age_seconds") == pytest.approx(3.0)
    assert value(text, "xpu_backend_up") == 1


def test_no_snapshot_yet_marks_collectors_failed() -> None:
    text = render(None, 0.0)
    assert value(text, "xpu_collector_success", collector="card") == 0
    assert "xpu_gpu_info" not in names(text)


def test_a_broken_collector_fails_alone(snapshot: Snapshot, clock: FakeClock) -> None:
    class Broken:
        name = "broken"

        def collect(self, snapshot: Snapshot, now: float) -> list[object]:
            raise RuntimeError("bug")

    registry = CollectorRegistry(auto_describe=False)
    collectors = [*default_collectors(), Broken()]
    registry.register(SnapshotExporter(lambda: snapshot, collectors, clock=lambda: clock.now))  # type: ignore[list-item]
    text = generate_latest(registry).decode()
    assert value(text, "xpu_collector_success", collector="broken") == 0
    assert value(text, "xpu_collector_success", collector="card") == 1


@pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="promtool (Debian package prometheus) not installed",
)
def test_promtool_finds_no_problems(sim: SimulatedBackend, clock: FakeClock) -> None:
    sim.inject("hang", 4, {"call": "sample"})
    s = Sampler(sim, CONFIG, clock=clock)
    text = render(s.run_once(), clock.now)
    sim.clear()
    s.stop()
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
