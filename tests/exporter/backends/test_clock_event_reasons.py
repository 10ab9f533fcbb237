"""One clock-event-reason flag type: NVML's bits, the exported labels, and one slowdown set for every reader.

The exporter's series and the throttle probe read ``ClockEventReason``; these tests hold it to nvidia-ml-py's
constants and to the label values the shipped dashboards and alert rules match on. The status page has no rule of its
own: it shows the throttle probe's verdict, and the last test follows each bit through the daemon's fault engine and
status-page providers to the card's state cell.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pynvml
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.backends.types import ClockEventReason
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.status_page import card_problems, render_status_page
from healthd.probes.throttle import ThrottleProbe
from tests.support.clock import FakeClock
from tests.support.faults_helpers import make_engine
from tests.support.paths import REPO

ROOT = REPO
# The reason label values as exported since the first release; dashboards and alert rules match on them.
EXPORTED_LABELS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)
REASON_MATCHERS = re.compile(r'reason\s*[=!]~\s*\\?"([a-z_|]+)\\?"')


def test_the_flags_are_nvmls_bits() -> None:
    for reason in ClockEventReason:
        camel = "".join(word.capitalize() for word in (reason.name or "").split("_"))
        assert int(reason) == getattr(pynvml, f"nvmlClocksEventReason{camel}"), reason
    everything = 0
    for reason in ClockEventReason:
        everything |= reason
    assert everything == pynvml.nvmlClocksEventReasonAll, "every reason nvidia-ml-py defines has a name here"


def test_labels_are_the_exported_ones_in_bit_order() -> None:
    assert tuple(reason.label for reason in ClockEventReason) == EXPORTED_LABELS
    assert ClockEventReason.active(0x229) == (
        ClockEventReason.GPU_IDLE,
        ClockEventReason.HW_SLOWDOWN,
        ClockEventReason.SW_THERMAL_SLOWDOWN,
    ), "a bit a newer driver adds (0x200) is ignored, not an error"


def test_dashboards_and_alert_rules_name_only_exported_reasons() -> None:
    texts = [(ROOT / "alerts" / "xpu-healthd.rules.yml").read_text()]
    texts += [path.read_text() for path in sorted((ROOT / "dashboards").glob("*.json"))]
    named = {label for text in texts for match in REASON_MATCHERS.findall(text) for label in match.split("|")}
    assert named, "the shipped rules and dashboards select clock-event reasons"
    assert named <= set(EXPORTED_LABELS)
    health = json.loads((ROOT / "dashboards" / "xpu-health.json").read_text())
    exprs = [expr for expr in _exprs(health) if "xpu_gpu_clock_event_active" in expr]
    (slowdown_panel,) = [set(m.split("|")) for e in exprs for m in REASON_MATCHERS.findall(e)]
    assert slowdown_panel == {r.label for r in ClockEventReason.slowdowns(ClockEventReason.SLOWDOWN)}


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in _exprs(value)]
    return []


@pytest.fixture
def snapshot(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    sampler = Sampler(sim, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0), clock=clock)
    sampler.run_once()
    clock.advance(10)
    snap = sampler.run_once()
    sampler.stop()
    return snap


def _with_reasons(snap: Snapshot, gpu: int, bits: int, sampled_at: float | None = None) -> Snapshot:
    gpus = list(snap.gpus)
    g = gpus[gpu]
    assert g.sample is not None
    sample = dataclasses.replace(g.sample, clock_event_reasons=bits)
    gpus[gpu] = dataclasses.replace(g, sample=sample, sampled_at=g.sampled_at if sampled_at is None else sampled_at)
    return dataclasses.replace(snap, gpus=tuple(gpus))


def test_the_series_carry_each_bit(snapshot: Snapshot, clock: FakeClock) -> None:
    bits = ClockEventReason.SW_POWER_CAP | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    snap = _with_reasons(snapshot, 3, bits)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snap, default_collectors(), clock=lambda: clock.now))
    active = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "xpu_gpu_clock_event_active" and s.labels["gpu"] == "3"
    }
    assert active == {label: float(label in {"sw_power_cap", "hw_power_brake_slowdown"}) for label in EXPORTED_LABELS}


SLOWDOWNS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}  # nvml.h


@pytest.mark.parametrize("reason", list(ClockEventReason), ids=lambda r: r.label)
def test_the_status_page_shows_the_throttle_probes_verdict_on_every_bit(
    snapshot: Snapshot, reason: ClockEventReason, clock: FakeClock, tmp_path: Path
) -> None:
    engine = make_engine(tmp_path, clock)
    probe = ThrottleProbe()
    snap = snapshot
    for i in range(6):  # held in every sample, past the probe's minimum of 5
        snap = _with_reasons(snapshot, 2, reason, sampled_at=snapshot.taken_at + 60 * i)
        engine.accept_report(probe.evaluate(snap, snapshot.taken_at + 60 * i))
        clock.advance(60)
    checks, faults = engine.check_states(), engine.active_faults()
    shown = [(p.level, p.text) for p in card_problems(snap.gpus[2], checks, faults)]
    if reason.label in SLOWDOWNS:
        check = f"clocks: clock slowdown ({reason.label}) in 100% of samples over the last 600s"
        assert shown == [("warn", check), ("warn", "fault clocks_hw_slowdown")]
        assert check in render_status_page(snap, clock.now, checks=engine.check_states, faults=engine.active_faults)
    else:
        assert shown == [], f"{reason.label} is not a slowdown (nvml.h)"
    assert all(card_problems(g, checks, faults) == [] for g in snap.gpus if g.index != 2)
