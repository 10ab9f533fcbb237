"""The golden node (tests/golden/h200x1.prom, see test_golden_exposition.py) rendered the way the daemon serves it:
collectors writing series into the block-cached render (exporter/collectors/render.py), not through
prometheus_client's encoder. The same file, byte for byte, on the first render and on a second one made from the
blocks the first kept."""

from __future__ import annotations

from pathlib import Path

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.collectors.dcgm_fields import VERSIONS
from exporter.collectors.render import SnapshotRenderer
from exporter.encoding import encode_sections
from exporter.sampler import Sampler, SamplerSettings
from healthd.daemon.cards import last_xid_per_gpu
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
DCGM_GOLDEN = {version: TESTS / "golden" / f"h200x1-dcgm-{version}.prom" for version in VERSIONS}
START = 1_800_000_000.0  # the golden test's clock, interval and constant self-timing
INTERVAL = 5.0


def _no_elapsed() -> float:
    return 0.0


def test_the_served_render_is_the_golden_file(tmp_path: Path) -> None:
    clock = FakeClock(START)
    backend = SimulatedBackend(load_scenario("h200x1"), clock=clock)
    sampler = Sampler(
        backend,
        SamplerSettings(interval_seconds=INTERVAL, call_deadline_seconds=2.0),
        clock=clock,
        monotonic=_no_elapsed,
    )
    journal = Journal(tmp_path / "faults.sqlite")
    engine = FaultEngine(journal, FaultsSettings(), boot_id="golden-boot", clock=clock)
    runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), engine, clock)
    try:
        for _ in range(2):
            clock.advance(INTERVAL)
            runner.on_snapshot(sampler.run_once())
        watcher = XidWatcher(backend, None, load_catalog(), engine, clock, sampler.latest)
        backend.inject("xid", 0, {"code": "79"})
        event = backend.wait_event(0)
        assert event is not None
        watcher.on_device_event(event)
        clock.advance(INTERVAL)
        snapshot = sampler.run_once()
        runner.on_snapshot(snapshot)
        renderer = SnapshotRenderer(
            [*default_collectors(), FaultMetricsCollector(engine)], clock=clock, monotonic=_no_elapsed
        )
        golden = GOLDEN.read_bytes()
        assert encode_sections(renderer.render(snapshot).sections, openmetrics=False) == golden
        assert encode_sections(renderer.render(snapshot).sections, openmetrics=False) == golden, "from kept blocks"
        for version in VERSIONS:  # dcgm-exporter's names go through the compatibility path, also byte for byte
            dcgm = DcgmCompatCollector("golden-node", lambda: last_xid_per_gpu(engine.active_faults()), version=version)
            compat = SnapshotRenderer([dcgm], clock=clock, monotonic=_no_elapsed)
            expected = DCGM_GOLDEN[version].read_bytes()
            assert encode_sections(compat.render(snapshot).sections, openmetrics=False) == expected, version
    finally:
        backend.clear()
        sampler.stop(timeout=1.0)
        journal.close()
