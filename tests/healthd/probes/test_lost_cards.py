from __future__ import annotations

import json
import os
import tomllib
from importlib import resources
from pathlib import Path

from exporter.backends.scenario import parse_scenario
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.findings import Action, Severity
from healthd.probes.lost_cards import INVENTORY_FILE, LostCardProbe, Settings, scan_pci_gpus
from tests.support.clock import FakeClock
from tests.support.probe_node import Node, codes, only

H200X8_BUS_IDS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def _snapshot_without(clock: FakeClock, missing: int) -> Snapshot:
    """A real Snapshot of the h200x8 node after a reboot with one card gone from the bus."""
    data = tomllib.loads(resources.files("exporter.scenarios").joinpath("h200x8.toml").read_text())
    data["gpus"] = [g for i, g in enumerate(data["gpus"]) if i != missing]
    data["processes"] = [p for p in data.get("processes", []) if p["gpu"] < len(data["gpus"])]
    data["mig_instances"] = [m for m in data.get("mig_instances", []) if m["gpu"] < len(data["gpus"])]
    sampler = Sampler(SimulatedBackend(parse_scenario(data), clock=clock), SamplerSettings(5.0, 2.0), clock=clock)
    try:
        return sampler.run_once()
    finally:
        sampler.stop(1.0)


def _sysfs(tmp_path: Path, gpus: dict[str, str], extra: dict[str, tuple[str, str]] | None = None) -> Path:
    """gpus: bus -> bound driver ("" for none). extra: sysfs name -> (vendor, class) of other devices."""
    root = tmp_path / "sys"
    devices = root / "bus" / "pci" / "devices"
    drivers = root / "bus" / "pci" / "drivers"
    devices.mkdir(parents=True)
    for bus, driver in gpus.items():
        d = devices / f"0000:{bus}:00.0"
        d.mkdir()
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(drivers / driver, d / "driver")
    for name, (vendor, klass) in (extra or {}).items():
        d = devices / name
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    return root


def test_learns_the_count_once_and_persists_it(h200x8: Node, tmp_path: Path) -> None:
    probe = LostCardProbe(state_dir=tmp_path)
    report = probe.evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert str(report.results[0].status) == "ok"
    saved = json.loads((tmp_path / INVENTORY_FILE).read_text())
    assert saved["gpu_count"] == 8
    assert len(saved["uuids"]) == 8
    assert [p.name for p in tmp_path.iterdir()] == [INVENTORY_FILE]  # no temporary file left behind


def test_card_missing_after_restart_is_found_from_the_learned_count(
    h200x8: Node, clock: FakeClock, tmp_path: Path
) -> None:
    LostCardProbe(state_dir=tmp_path).evaluate(h200x8.tick(), clock())
    lost_uuid = h200x8.backend.scenario.cards[3].uuid
    restarted = LostCardProbe(state_dir=tmp_path)  # a new daemon process
    report = restarted.evaluate(_snapshot_without(clock, 3), clock())
    f = only(report, "gpu_count_low")
    assert (f.severity, f.action) == (Severity.CRITICAL, Action.REBOOT_NODE)
    assert f.evidence["missing"] == lost_uuid
    assert f.evidence["source"] == "learned"
    assert str(report.results[0].status) == "failed"
    # the learned count is not overwritten by the smaller inventory
    assert json.loads((tmp_path / INVENTORY_FILE).read_text())["gpu_count"] == 8


def test_configured_count_wins(h200x8: Node, tmp_path: Path) -> None:
    probe = LostCardProbe(Settings(expected_gpus=9), state_dir=tmp_path)
    f = only(probe.evaluate(h200x8.tick(), h200x8.clock()), "gpu_count_low")
    assert f.evidence["source"] == "configured"
    assert not (tmp_path / INVENTORY_FILE).exists()


def test_damaged_state_file_is_not_relearned(h200x8: Node, tmp_path: Path) -> None:
    (tmp_path / INVENTORY_FILE).write_text("{not json")
    report = LostCardProbe(state_dir=tmp_path).evaluate(h200x8.tick(), 0)
    assert report.findings == ()
    assert str(report.results[0].status) == "unknown"
    assert "remove it" in report.results[0].detail
    assert (tmp_path / INVENTORY_FILE).read_text() == "{not json"


def test_pci_scan_finds_gpus_only(tmp_path: Path) -> None:
    root = _sysfs(
        tmp_path,
        {"18": "nvidia", "2a": ""},
        {"0000:05:00.0": ("0x10de", "0x068000"), "0000:06:00.0": ("0x8086", "0x030000")},  # NVSwitch, Intel VGA
    )
    assert [(g.address, g.driver) for g in scan_pci_gpus(root)] == [("0000:18:00", "nvidia"), ("0000:2a:00", "")]


def test_gpu_on_the_bus_that_nvml_does_not_list(h200x8: Node, tmp_path: Path) -> None:
    root = _sysfs(tmp_path, {**dict.fromkeys(H200X8_BUS_IDS, "nvidia"), "e1": "", "e2": "vfio-pci"})
    report = LostCardProbe(sysfs_root=root).evaluate(h200x8.tick(), h200x8.clock())
    f = only(report, "gpu_not_visible")  # e1 has no driver; e2 is passed through to a VM on purpose
    assert f.evidence["pci_bus_id"] == "0000:e1:00"
    assert "no driver" in f.message
    assert f.action is Action.REBOOT_NODE


def test_all_gpus_visible(h200x8: Node, tmp_path: Path) -> None:
    root = _sysfs(tmp_path, dict.fromkeys(H200X8_BUS_IDS, "nvidia"))
    report = LostCardProbe(sysfs_root=root).evaluate(h200x8.tick(), h200x8.clock())
    assert codes(report) == set()
    assert str(report.results[0].status) == "ok"


def test_nothing_known_is_unknown_not_ok(h200x8: Node) -> None:
    report = LostCardProbe().evaluate(h200x8.tick(), h200x8.clock())
    assert report.findings == ()
    assert str(report.results[0].status) == "unknown"
