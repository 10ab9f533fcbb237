from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import structlog.testing

from exporter.snapshot import Snapshot
from healthd.findings import Action, Finding, Severity
from healthd.xid.catalog import CatalogError, XidOverride, load_catalog, parse_overrides
from healthd.xid.kmsg import KmsgRecord, format_record, format_xid, parse_record
from healthd.xid.watcher import XidSettings, XidWatcher
from tests.support.clock import FakeClock
from tests.support.paths import FIXTURES
from tests.support.probe_node import Node

FIXTURE = FIXTURES / "kmsg-nvrm.txt"
GPU2_PCI = "0000:3a:00"  # h200x8 GPU 2 is 00000000:3A:00.0


class Sink:
    def __init__(self) -> None:
        self.events: list[Finding] = []
        self._lock = threading.Lock()

    def event(self, finding: Finding) -> None:
        with self._lock:
            self.events.append(finding)


def _record(line: str) -> KmsgRecord:
    record = parse_record(format_record(KmsgRecord(4, 1, 1, "-", line)))
    assert record is not None
    return record


def _watcher(node: Node, sink: Sink, snap: Snapshot, **kw: object) -> XidWatcher:
    return XidWatcher(node.backend, None, load_catalog(), sink, node.clock, lambda: snap, **kw)  # type: ignore[arg-type]


def _next_event(node: Node) -> object:
    event = node.backend.wait_event(0)
    assert event is not None
    return event


def test_same_xid_from_nvml_and_kmsg_counts_once(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    h200x8.inject("gpu_lost", 2)  # the simulator emits XID 79 as an NVML event
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 79, "GPU has fallen off the bus.", pid=2154)))
    watcher.on_kmsg_record(_record("NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus."))
    assert len(sink.events) == 1
    f = sink.events[0]
    assert (f.code, f.kind, f.severity, f.action) == ("xid_79", "event", Severity.FATAL, Action.REPLACE_NODE)
    assert f.gpu is not None
    assert (f.gpu.index, f.evidence["source"], f.evidence["pci_bus_id"]) == (2, "nvml", GPU2_PCI)
    assert watcher.merger.merged == 2


def test_kmsg_first_then_nvml_also_counts_once(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 79, "GPU has fallen off the bus.")))
    h200x8.inject("xid", 2, code=79)
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    assert [f.evidence["source"] for f in sink.events] == ["kmsg"]


def test_a_burst_is_one_finding_per_window(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick(), settings=XidSettings(merge_window_seconds=10))
    for _ in range(100):
        h200x8.inject("xid", 2, code=95)
        watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
        for _ in range(3):
            watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 95, "Uncontained: FBHUB. RST: Yes, D-RST: No")))
    assert len(sink.events) == 1
    assert watcher.merger.merged == 399
    h200x8.clock.advance(10)
    watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 95, "again, a window later")))
    assert len(sink.events) == 2


def test_different_cards_and_xids_are_separate(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 48, "DBE")))
    watcher.on_kmsg_record(_record(format_xid("0000:18:00", 48, "DBE")))
    watcher.on_kmsg_record(_record(format_xid(GPU2_PCI, 63, "Row remapping event")))
    assert sorted((f.gpu.index if f.gpu else -1, f.code) for f in sink.events) == [
        (0, "xid_48"),
        (2, "xid_48"),
        (2, "xid_63"),
    ]


def test_application_xids_never_ask_for_more_than_an_app_restart(h200x8: Node) -> None:
    sink = Sink()
    overrides = {13: XidOverride(action=Action.REPLACE_NODE, severity=Severity.FATAL)}  # a config that tries
    catalog = load_catalog(overrides=overrides)
    snap = h200x8.tick()
    watcher = XidWatcher(h200x8.backend, None, catalog, sink, h200x8.clock, lambda: snap)
    for xid in (13, 31, 43, 45, 68, 69, 137):
        h200x8.inject("xid", 0, code=xid)
        watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    assert len(sink.events) == 7
    assert all(f.action <= Action.RESTART_APP for f in sink.events)
    assert all(f.evidence["application_level"] == "true" for f in sink.events)


def test_real_log_lines_map_to_cards_and_catalog(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    for line in FIXTURE.read_text().splitlines():
        record = parse_record(line)
        if record is not None:
            watcher.on_kmsg_record(record)
    by_code = {}
    for f in sink.events:
        by_code.setdefault(f.code, []).append(f)
    # 3a:00 (GPU 2) XID 79 line + fallen-off-bus line: one; three XID 13 lines of one exception: one
    assert len(by_code["xid_13"]) == 1
    # 01:00 and 0e:00 are not cards of this node; 9a:00 (split over two records) is GPU 4
    assert [f.gpu.index if f.gpu else None for f in by_code["xid_79"]] == [2, None, None, 4]
    assert by_code["xid_48"][0].gpu is not None
    assert by_code["xid_48"][0].gpu.index == 0
    xid13 = by_code["xid_13"][0]
    assert (xid13.action, xid13.gpu, xid13.evidence["pid"], xid13.evidence["process"]) == (
        Action.RESTART_APP,
        None,  # 0000:86:00 is not a card of this node: node-wide, with the PCI address as evidence
        "1234",
        "python",
    )
    assert xid13.evidence["pci_bus_id"] == "0000:86:00"
    assert by_code["xid_14"][0].severity is Severity.WARNING  # not in the catalog: a warning, no action
    assert by_code["xid_14"][0].action is Action.NONE
    assert by_code["xid_94"][0].action is Action.RESTART_APP


def test_ecc_events(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    h200x8.inject("ecc", 1, corrected=5, uncorrected=1)
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]  # SBE: left to the ECC probe
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    watcher.on_kmsg_record(_record(format_xid("0000:2a:00", 48, "An uncorrectable double bit error (DBE)")))
    assert [(f.code, f.gpu.index if f.gpu else None) for f in sink.events] == [("xid_48", 1)]
    assert watcher.ignored_events == 1


def test_threads_end_to_end(clock: FakeClock, tmp_path: Path) -> None:
    node = Node("h200x8", clock)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sink = Sink()
    snap = node.tick()
    watcher = XidWatcher(
        node.backend,
        kmsg,
        load_catalog(),
        sink,
        clock,
        lambda: snap,
        kmsg_from_start=True,
        nvml_wait_seconds=0.05,
        kmsg_poll_seconds=0.01,
    )
    watcher.start()
    try:
        node.inject("xid", 2, code=119)
        with kmsg.open("a") as f:
            f.write(format_record(KmsgRecord(4, 7, 7, "-", format_xid(GPU2_PCI, 119, "Timeout after 6s"))) + "\n")
        deadline = time.monotonic() + 10
        while watcher.merger.emitted + watcher.merger.merged < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
        node.close()
    assert [(f.code, f.gpu.index if f.gpu else None) for f in sink.events] == [("xid_119", 2)]
    assert watcher.merger.merged == 1


def test_event_loop_backs_off_while_the_driver_is_down(clock: FakeClock) -> None:
    node = Node("h200x1", clock)  # never opened: wait_event raises DriverUnavailableError
    watcher = XidWatcher(node.backend, None, load_catalog(), Sink(), clock, nvml_retry_seconds=0.01)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while watcher.nvml_errors < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert watcher.nvml_errors >= 2


def test_catalog_content() -> None:
    catalog = load_catalog()
    assert catalog.version
    assert len(catalog) >= 45
    for xid in catalog.xids():
        entry = catalog.lookup(xid)
        if entry.application_level:
            assert entry.action <= Action.RESTART_APP, xid
    assert {x for x in catalog.xids() if catalog.lookup(x).application_level} >= {13, 31, 43, 45, 68}
    assert catalog.lookup(79).action is Action.REPLACE_NODE
    assert catalog.lookup(48).action is Action.RESET_GPU
    assert not catalog.lookup(99999).known


def test_overrides_parse_and_apply() -> None:
    overrides = parse_overrides({"94": {"severity": "info", "action": "none"}, "200": {"action": "reset_gpu"}}, "x")
    catalog = load_catalog(overrides=overrides)
    assert (catalog.lookup(94).severity, catalog.lookup(94).action) == (Severity.INFO, Action.NONE)
    assert catalog.lookup(200).action is Action.RESET_GPU
    assert catalog.version.endswith("+overrides")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"abc": {}}, "health.xid.overrides.abc: an XID must be a positive integer"),
        ({"13": "fatal"}, "health.xid.overrides.13: expected a table"),
        ({"13": {"severity": "loud"}}, "health.xid.overrides.13.severity: must be one of"),
        ({"13": {"action": "pray"}}, "health.xid.overrides.13.action: must be one of"),
        ({"13": {"colour": "red"}}, "health.xid.overrides.13.colour: unknown option"),
        ({"13": {"application_level": "yes"}}, "health.xid.overrides.13.application_level: expected true or false"),
    ],
)
def test_override_errors_name_the_option(table: dict[str, object], message: str) -> None:
    with pytest.raises(CatalogError) as err:
        parse_overrides(table, "health.xid.overrides")
    assert str(err.value).startswith(message)


# --- MIG instances named by NVML events ---------------------------------------------------------------------------

GPU7_PCI = "0000:db:00"  # h200x8 GPU 7 (MIG on: GPU instance 1 is 3g.71gb, 2 is 2g.35gb)


def test_xid_in_a_mig_instance_names_the_mig_device(h200x8: Node) -> None:
    sink = Sink()
    snap = h200x8.tick()
    gpu7 = snap.gpu(7)
    assert gpu7 is not None
    instance = next(m for m in gpu7.mig_instances if m.gpu_instance_id == 1)
    watcher = _watcher(h200x8, sink, snap)
    h200x8.inject("xid", 7, code=13, gpu_instance_id=1)
    finding = watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    assert finding is not None and finding.gpu is not None and finding.gpu.index == 7
    assert f"GPU 7 MIG 3g.71gb (GPU instance 1, compute instance 0, {instance.uuid})" in finding.message
    assert finding.evidence["mig_uuid"] == instance.uuid
    assert (finding.evidence["gpu_instance_id"], finding.evidence["compute_instance_id"]) == ("1", "0")
    assert finding.evidence["mig_profile"] == "3g.71gb"
    assert finding.action is Action.RESTART_APP  # XID 13 stays the tenant's problem, in its instance


def test_same_xid_in_two_mig_instances_is_two_findings_and_kmsg_merges(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    for gi in (1, 2, 1):
        h200x8.inject("xid", 7, code=31, gpu_instance_id=gi)
        watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    watcher.on_kmsg_record(_record(format_xid(GPU7_PCI, 31, "MMU Fault: ENGINE GRAPHICS")))
    assert [f.evidence.get("gpu_instance_id") for f in sink.events] == ["1", "2"]
    assert watcher.merger.merged == 2  # GI 1 again, and the kernel's line of the same incident


def test_kmsg_first_then_a_mig_event_counts_once(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    watcher.on_kmsg_record(_record(format_xid(GPU7_PCI, 43, "Ch 00000010")))
    h200x8.inject("xid", 7, code=43, gpu_instance_id=2)
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    assert len(sink.events) == 1 and sink.events[0].evidence["source"] == "kmsg"
    h200x8.inject("xid", 7, code=43, gpu_instance_id=1)  # another instance: another tenant's incident
    watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    # the first MIG sighting joined the kmsg one (the same incident); a second instance is a new one
    assert [(f.evidence["source"], f.evidence.get("gpu_instance_id")) for f in sink.events] == [
        ("kmsg", None),
        ("nvml", "1"),
    ]
    assert watcher.merger.merged == 1


def test_instance_created_after_the_snapshot_is_named_by_its_ids(h200x8: Node) -> None:
    sink = Sink()
    snap = h200x8.tick()
    created = h200x8.backend.create_mig_instance(6, 19, 0)  # GPU 6 has MIG on and no instance in the snapshot
    watcher = _watcher(h200x8, sink, snap)
    h200x8.inject("xid", 6, code=13, gpu_instance_id=created.gpu_instance_id)
    finding = watcher.on_device_event(_next_event(h200x8))  # type: ignore[arg-type]
    assert finding is not None
    assert f"MIG (GPU instance {created.gpu_instance_id}, compute instance 0)" in finding.message
    assert "mig_uuid" not in finding.evidence


def test_look_alike_lines_raise_nothing_and_are_logged_once_a_minute(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    spoofs = [
        KmsgRecord(6, 1, 1, "-", f"usb 1-1: Product: {format_xid(GPU2_PCI, 79, 'spoof')}"),  # kernel, prefix inside
        KmsgRecord(12, 2, 2, "-", format_xid(GPU2_PCI, 79, "GPU has fallen off the bus.")),  # user-space write
        KmsgRecord(12, 3, 3, "-", "NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus."),
    ]
    with structlog.testing.capture_logs() as logs:
        for record in spoofs * 50:
            assert watcher.on_kmsg_record(record) is None
        h200x8.clock.advance(61)
        watcher.on_kmsg_record(spoofs[0])
    assert sink.events == []
    warnings = [e for e in logs if "not the NVIDIA driver" in e["event"]]
    # 150 look-alikes within a minute: one warning, then the next minute's one with the count in between
    assert [w["count"] for w in warnings] == [1, 150]
    assert "usb 1-1: Product: NVRM: Xid" in warnings[0]["example"]


def test_mig_attribution_is_kept_as_evidence(h200x8: Node) -> None:
    sink = Sink()
    watcher = _watcher(h200x8, sink, h200x8.tick())
    line = f"NVRM: Xid (PCI:{GPU2_PCI} GPU-I:03 GPU-CI:00): 31, pid=77, name=train, MMU Fault: ENGINE GRAPHICS"
    finding = watcher.on_kmsg_record(_record(line))
    assert finding is not None and finding.gpu is not None
    assert finding.gpu.index == 2
    assert (finding.evidence["gpu_instance_id"], finding.evidence["compute_instance_id"]) == ("3", "0")
    assert (finding.evidence["pid"], finding.evidence["process"]) == ("77", "train")
