"""Kernel-log records logged while the daemon was down are read when it is back (once), in the same boot only."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from healthd.xid.kmsg import KmsgReader, KmsgRecord, format_record, format_xid
from healthd.xid.kmsg_cursor import KmsgCursor
from tests.exporter.collectors.test_card_metrics import value
from tests.support.daemon_process import DaemonProcess
from tests.support.waiting import eventually, wait_until

GPU0_PCI = "0000:18:00"  # h200x8: GPU 0 is 00000000:18:00.0, GPU 3 5D
GPU3_PCI = "0000:5d:00"


def _append(path: Path, *records: KmsgRecord) -> None:
    with path.open("a") as f:
        for record in records:
            f.write(format_record(record) + "\n")


def _xid(seq: int, pci: str, code: int) -> KmsgRecord:
    return KmsgRecord(3, seq, seq * 1000, "-", format_xid(pci, code, "test"))


@pytest.mark.e2e
def test_an_xid_logged_while_the_daemon_was_down_is_read_after_the_restart(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = f'[host]\nkmsg_path = "{kmsg}"\n'
    first = DaemonProcess(tmp_path, extra_config=config).start()
    try:
        _append(kmsg, _xid(1, GPU0_PCI, 48))
        wait_until(lambda: "xid_48" in first.xpuctl("faults", "list").stdout, "the XID 48 read while up", 30)
        cursor = tmp_path / "state" / "kmsg-cursor.json"
        wait_until(lambda: cursor.exists() and '"seq": 1' in cursor.read_text(), "the position saved", 10)
    finally:
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
    _append(kmsg, _xid(2, GPU3_PCI, 79))  # logged while nobody reads
    with DaemonProcess(tmp_path, extra_config=config) as again:
        wait_until(
            lambda: "xid_79" in again.xpuctl("faults", "list", "--gpu", "3").stdout, "the XID 79 missed while down", 30
        )
        _append(kmsg, _xid(3, GPU3_PCI, 13))
        wait_until(lambda: "xid_13" in again.xpuctl("faults", "list", "--gpu", "3").stdout, "a later line", 30)
        # /metrics is rendered once per sampling cycle: one scrape may predate the XIDs just recorded
        metrics = wait_until(lambda: counted(again.metrics(), "13"), "the XID 13 counted on /metrics", 30)
        assert not value(metrics, "xpu_xid_errors_total", gpu="0", xid="48"), "the record read before is not replayed"
        assert value(metrics, "xpu_xid_errors_total", gpu="3", xid="79") == 1


def counted(metrics: str, xid: str) -> str:
    """The scrape once it counts ``xid`` on GPU 3; empty before."""
    return metrics if value(metrics, "xpu_xid_errors_total", gpu="3", xid=xid) else ""


def _reader(path: Path, cursor: KmsgCursor, seen: list[int]) -> KmsgReader:
    return KmsgReader(path, lambda r: seen.append(r.seq), cursor=cursor, poll_seconds=0.02)


def test_replay_hands_on_only_the_gap_and_counts_what_the_ring_dropped(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    cursor = KmsgCursor(tmp_path / "kmsg-cursor.json", "boot-a")
    cursor.save(4)
    _append(log, *(_xid(seq, GPU0_PCI, 13) for seq in (2, 3, 4, 7, 8)))  # 5 and 6 were overwritten meanwhile
    seen: list[int] = []
    reader = _reader(log, cursor, seen)
    reader.start()
    assert eventually(lambda: seen == [7, 8], 5.0), seen
    assert reader.overwritten == 2
    reader.stop()
    assert cursor.load() == 8, "saved when the reader stops"


def test_another_boots_position_means_nothing_the_reader_starts_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    KmsgCursor(tmp_path / "kmsg-cursor.json", "boot-a").save(1)
    _append(log, *(_xid(seq, GPU0_PCI, 13) for seq in (1, 2, 3)))
    seen: list[int] = []
    reader = _reader(log, KmsgCursor(tmp_path / "kmsg-cursor.json", "boot-b"), seen)
    reader.start()
    assert reader.following.wait(5.0)
    _append(log, _xid(1, GPU0_PCI, 31))  # the new boot's first record
    assert eventually(lambda: seen == [1], 5.0), seen
    reader.stop()


def test_a_damaged_position_file_is_a_first_start(tmp_path: Path) -> None:
    path = tmp_path / "kmsg-cursor.json"
    for text in ("", "{", '{"boot_id": "b", "seq": -3}', '{"boot_id": "b", "seq": true}', "[1]"):
        path.write_text(text)
        assert KmsgCursor(path, "b").load() is None
