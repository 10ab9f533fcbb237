"""The whole /metrics exposition of the simulated h200x1 node after an XID 79, compared with a file, line by line;
and the dcgm-exporter series of the same node once per release line ([exporter] dcgm_compat_version 4.8 and 4.10).

In the style of node_exporter's end-to-end fixture: the single-card node replays a real H200 capture, the clock is
fixed, the XID goes through the real watcher, fault engine and journal, and the probes run once, so the output is
the same on every machine. Any change to a metric's name, labels, help text, type or value shows as a diff here.
When a change is intended, regenerate the file and review its diff:

    ./dev test tests/exporter/collectors/test_golden_exposition.py --update-golden
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporter.backends.scenario import load_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.collectors.dcgm_fields import VERSIONS
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
START = 1_800_000_000.0
INTERVAL = 5.0


def _no_elapsed() -> float:
    """The monotonic clock of the sampler's and the collectors' self-timing: constant, so durations render as 0."""
    return 0.0


Render = Callable[[list[object]], str]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Render, FaultEngine]]:
    """The node after the XID, and a function that renders /metrics with the given collectors."""
    clock = FakeClock(START)
    backend = SimulatedBackend(load_scenario("h200x1"), clock=clock)
    config = SamplerSettings(interval_seconds=INTERVAL, call_deadline_seconds=2.0)
    sampler = Sampler(backend, config, clock=clock, monotonic=_no_elapsed)
    journal = Journal(tmp_path / "faults.sqlite")
    engine = FaultEngine(journal, FaultsSettings(), boot_id="golden-boot", clock=clock)
    runner = ProbeRunner(default_probes(HealthSettings(), ProbeHost(state_dir=tmp_path)), engine, clock)

    def render(collectors: list[object]) -> str:
        registry = CollectorRegistry(auto_describe=False)
        exporter = SnapshotExporter(sampler.latest, collectors, clock=clock, monotonic=_no_elapsed)  # type: ignore[arg-type]
        registry.register(exporter)
        return generate_latest(registry).decode()

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
        yield render, engine
    finally:
        backend.clear()
        sampler.stop(timeout=1.0)
        journal.close()


@pytest.fixture
def exposition(node: tuple[Render, FaultEngine]) -> str:
    render, engine = node
    return render([*default_collectors(), FaultMetricsCollector(engine)])


def _compare(path: Path, text: str, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--update-golden"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.skip(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), text.splitlines(keepends=True), "golden", "now", n=0
            )
        )
        pytest.fail(f"/metrics differs from {path.name} (rerun with --update-golden if intended):\n{diff}")


def test_exposition_matches_the_golden_file(exposition: str, request: pytest.FixtureRequest) -> None:
    _compare(GOLDEN, exposition, request)


@pytest.mark.parametrize("version", VERSIONS)
def test_dcgm_series_match_the_golden_file(
    node: tuple[Render, FaultEngine], version: str, request: pytest.FixtureRequest
) -> None:
    render, engine = node

    def last_xid() -> Mapping[int, int]:
        return last_xid_per_gpu(engine.active_faults())

    text = render([DcgmCompatCollector("golden-node", last_xid, version=version)])
    _compare(DCGM_GOLDEN[version], text, request)


def test_the_golden_file_shows_the_xid(exposition: str) -> None:
    """The golden file is only worth comparing with if it holds what the scenario is about."""
    assert 'xpu_gpu_up{gpu="0"' in exposition
    assert 'xpu_faults_active{action="replace_node",code="xid_79"' in exposition


def test_the_dcgm_golden_files_show_their_lines_names() -> None:
    old, new = DCGM_GOLDEN["4.8"].read_text(), DCGM_GOLDEN["4.10"].read_text()
    assert re.search(r'^DCGM_FI_DEV_XID_ERRORS\{.*DCGM_FI_DRIVER_VERSION="580\.159\.04".*\} 79\.0$', old, re.M)
    assert re.search(r'^DCGM_FI_DEV_XID_ERROR\{.*DCGM_FI_SYSTEM_DRIVER_VERSION="580\.159\.04".*\} 79\.0$', new, re.M)
    assert "# TYPE DCGM_FI_DEV_SM_CLOCK gauge" in old and "DCGM_FI_DEV_SM_CLOCK_HERTZ" not in old
    assert "# TYPE DCGM_FI_DEV_SM_CLOCK_HERTZ gauge" in new and "DCGM_FI_DEV_SM_CLOCK{" not in new
