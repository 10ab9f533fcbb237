"""The whole /metrics exposition of the simulated h200x1 node after an XID 79, compared with a file, line by line.

In the style of node_exporter's end-to-end fixture: the single-card node replays a real H200 capture, the clock is
fixed, the XID goes through the real watcher, fault engine and journal, and the probes run once, so the output is
the same on every machine. Any change to a metric's name, labels, help text, type or value shows as a diff here.
When a change is intended, regenerate the file and review its diff:

    ./dev test tests/exporter/collectors/test_golden_exposition.py --update-golden
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.sampler import Sampler, SamplerConfig
from healthd.daemon.metrics import last_xid_per_gpu
from healthd.faults.engine import FaultEngine
from healthd.faults.journal import Journal
from healthd.faults.metrics import FaultMetricsCollector
from healthd.faults.settings import FaultsSettings
from healthd.probes import HealthSettings, ProbeHost, default_probes
from healthd.probes.runner import ProbeRunner
from healthd.xid.catalog import load_catalog
from healthd.xid.watcher import XidWatcher
from tests.support.clock import FakeClock
from tests.support.paths import TESTS

GOLDEN = TESTS / "golden" / "h200x1.prom"
START = 1_800_000_000.0
INTERVAL = 5.0


def _no_elapsed() -> float:
    """The monotonic clock of the sampler's and the collectors' self-timing: constant, so durations render as 0."""
    return 0.0


@pytest.fixture
def exposition(tmp_path: Path) -> Iterator[str]:
    clock = FakeClock(START)
    backend = SimulatedBackend(load_scenario("h200x1"), clock=clock)
    config = SamplerConfig(interval_seconds=INTERVAL, call_deadline_seconds=2.0)
    sampler = Sampler(backend, config, clock=clock, monotonic=_no_elapsed)
    journal = Journal(tmp_path / "faults.sqlite")
    engine = FaultEngine(journal, FaultsSettings(), boot_id="golden-boot", clock=clock)
    runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), engine, clock)
    try:
        for _ in range(2):  # two samples: counters have a previous value to compare with
            clock.advance(INTERVAL)
            runner.on_snapshot(sampler.run_once())
        watcher = XidWatcher(backend, None, load_catalog(), engine, clock, sampler.latest)
        backend.inject("xid", 0, {"code": "79"})
        event = backend.wait_event(0)
        assert event is not None
        watcher.on_device_event(event)
        clock.advance(INTERVAL)
        runner.on_snapshot(sampler.run_once())
        collectors = [
            *default_collectors(),
            DcgmCompatCollector("golden-node", last_xid_per_gpu(engine)),
            FaultMetricsCollector(engine),
        ]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotExporter(sampler.latest, collectors, clock=clock, monotonic=_no_elapsed))
        yield generate_latest(registry).decode()
    finally:
        backend.clear()
        sampler.stop(timeout=1.0)
        journal.close()


def test_exposition_matches_the_golden_file(exposition: str, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(exposition)
        pytest.skip(f"wrote {GOLDEN.relative_to(Path.cwd()) if GOLDEN.is_relative_to(Path.cwd()) else GOLDEN}")
    expected = GOLDEN.read_text()
    if exposition != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), exposition.splitlines(keepends=True), "golden", "now", n=0
            )
        )
        pytest.fail(f"/metrics differs from {GOLDEN.name} (rerun with --update-golden if intended):\n{diff}")


def test_the_golden_file_shows_the_xid(exposition: str) -> None:
    """The golden file is only worth comparing with if it holds what the scenario is about."""
    assert 'xpu_gpu_up{gpu="0"' in exposition
    assert 'xpu_faults_active{action="replace_node",code="xid_79"' in exposition
    assert "DCGM_FI_DEV_XID_ERRORS{" in exposition and "} 79.0" in exposition
