"""The kernel-log reader: /dev/kmsg records and syslog lines, the driver's NVRM formats, the reader thread."""

from __future__ import annotations

import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.xid.kmsg import (
    KmsgReader,
    KmsgRecord,
    NvrmDecoder,
    NvrmEvent,
    format_record,
    format_xid,
    normalize_pci,
    parse_line,
    parse_nvrm,
    parse_record,
)
from tests.support.kmsg_records import kernel_record
from tests.support.paths import FIXTURES
from tests.support.waiting import eventually

FIXTURE = FIXTURES / "kmsg-nvrm.txt"


def _decode_fixture() -> list[NvrmEvent]:
    decoder = NvrmDecoder()
    out = []
    for line in FIXTURE.read_text().splitlines():
        if line.startswith(" "):
            continue
        record = parse_record(line)
        assert record is not None, line
        event = decoder.feed(record)
        if event is not None:
            out.append(event)
    return out


def test_record_fields() -> None:
    r = parse_record("6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, y\n SUBSYSTEM=pci\n")
    assert r == KmsgRecord(6, 1234, 5678901, "-", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, y")
    assert parse_record("4,99,100,-,caller=T431;text") == KmsgRecord(4, 99, 100, "-,caller=T431", "text")
    for bad in ("", "no prefix", "6,1,2;too few fields", "x,1,2,-;bad priority", "6,1,2,-", "-1,1,2,-;neg"):
        assert parse_record(bad) is None


def test_raw_syslog_lines_keep_their_priority_and_bare_lines_are_refused() -> None:
    # /proc/kmsg and `dmesg --raw` print "<facility*8+level>[seconds] message"
    r = parse_line("<4>[ 1234.567890] NVRM: Xid (PCI:0000:cb:00): 109, pid=1, name=a, b")
    assert r == KmsgRecord(4, -1, 1_234_567_890, "", "NVRM: Xid (PCI:0000:cb:00): 109, pid=1, name=a, b")
    assert r.from_kernel
    user = parse_line("<12>NVRM: Xid (PCI:0000:cb:00): 79, pid=1, name=a, b")
    assert user is not None and user.priority == 12 and not user.from_kernel
    # without its priority a line cannot show who wrote it: `dmesg -T` output, a journal export, a log file
    assert parse_line("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1, name=a, b") is None
    assert parse_line("NVRM: Xid (PCI:0000:cb:00): 79, pid=1, name=a, b") is None
    assert parse_line("[ 12.3] usb 1-1: new device") is None


def test_real_driver_formats() -> None:
    events = _decode_fixture()
    summary = [(e.kind, e.pci, e.xid, e.pid, e.process) for e in events]
    assert summary == [
        ("identity", "0000:3a:00", None, None, None),
        ("xid", "0000:3a:00", 79, 2154, "python3"),
        ("fallen_off_bus", "0000:3a:00", 79, None, None),
        ("xid", "0000:18:00", 48, None, None),
        ("xid", "0000:86:00", 13, 1234, "python"),
        ("xid", "0000:86:00", 13, 1234, "python"),
        ("xid", "0000:86:00", 13, 1234, "python"),
        ("xid", "0000:cb:00", 109, 1797828, "pt_main_thread"),
        ("xid", "0000:03:00", 14, None, None),
        ("xid", "0000:01:00", 79, None, None),
        ("fallen_off_bus", "0000:0e:00", 79, None, None),
        ("fallen_off_bus", "0000:9a:00", 79, None, None),  # split over two records
        ("xid", "0000:5d:00", 94, 881, "vllm"),
    ]
    assert events[0].uuid == "GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f52"
    assert events[3].text.startswith("An uncorrectable double bit error (DBE)")
    assert events[4].text == "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"
    assert events[8].text == "Channel 00000001"


def test_normalize_pci() -> None:
    assert normalize_pci("00000000:3A:00.0") == "0000:3a:00"
    assert normalize_pci("PCI:0000:3b:00") == "0000:3b:00"
    assert normalize_pci("3b:00") == "0000:3b:00"
    assert normalize_pci("0001:3b:1f.7") == "0001:3b:1f"
    for bad in ("", "zz:00", "0000:3b:20", "1:2:3:4", "0000:100:00"):
        assert normalize_pci(bad) == ""


def test_non_driver_lines_are_ignored() -> None:
    assert parse_nvrm("nvidia-peermem nv_get_p2p_free_callback:127 ERROR") is None
    assert parse_nvrm("NVRM: GPU Board Serial Number: 1654523000103") is None
    assert parse_nvrm("NVRM: Xid (PCI:zzzz): 79, nonsense") is None


@settings(max_examples=500)
@given(st.text())
def test_parsers_never_raise_on_any_text(text: str) -> None:
    parse_record(text)
    parse_line(text)
    parse_line("<4>" + text)
    parse_nvrm(text)
    parse_nvrm("NVRM: " + text)
    parse_nvrm("NVRM: Xid (PCI:0000:3b:00): " + text)
    decoder = NvrmDecoder()
    decoder.feed(kernel_record("NVRM: The NVIDIA GPU 0000:9a:00.0 (PCI ID: 10de:28a0) installed in this"))
    decoder.feed(kernel_record(text))


@settings(max_examples=300)
@given(st.lists(st.text(alphabet=st.sampled_from("NVRM:Xid (PCI0123abcdef,;.-' ) \n\tpid=name<unknown>")), max_size=5))
def test_parsers_never_raise_on_near_miss_text(parts: list[str]) -> None:
    text = "".join(parts)
    parse_record(text)
    parse_nvrm(text)
    NvrmDecoder().feed(kernel_record(text))


_line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=80)


@given(
    priority=st.integers(0, 191),
    seq=st.integers(0, 2**63),
    usec=st.integers(0, 2**63),
    flags=st.sampled_from(["-", "c", "+", "-,caller=T1"]),
    message=_line_text,
)
def test_record_round_trip(priority: int, seq: int, usec: int, flags: str, message: str) -> None:
    record = KmsgRecord(priority, seq, usec, flags, message)
    assert parse_record(format_record(record)) == record


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    xid=st.integers(1, 999_999),
    pid=st.one_of(st.none(), st.integers(0, 2**31)),
    process=st.one_of(
        st.none(), _line_text.filter(lambda s: s == s.strip() and "," not in s and s not in ("", "<unknown>"))
    ),
    text=_line_text.filter(lambda s: s == s.strip()),
)
def test_xid_line_round_trip(
    domain: int, bus: int, device: int, xid: int, pid: int | None, process: str | None, text: str
) -> None:
    pci = f"{domain:04x}:{bus:02x}:{device:02x}"
    line = format_xid(pci, xid, text, pid=pid, process=process)
    event = parse_nvrm(line)
    assert event == NvrmEvent("xid", pci, xid, pid, process, text)
    record = parse_record(format_record(KmsgRecord(4, 1, 2, "-", line)))
    assert record is not None
    assert parse_nvrm(record.message) == event


def test_reader_follows_a_file_and_skips_continuation_lines(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("6,1,1,-;NVRM: old line before start\n")
    seen: list[KmsgRecord] = []
    lock = threading.Lock()

    def collect(r: KmsgRecord) -> None:
        with lock:
            seen.append(r)

    reader = KmsgReader(path, collect, poll_seconds=0.01)  # starts at the end: history is not replayed
    reader.start()
    try:
        assert reader.following.wait(10)
        with path.open("a") as f:
            f.write("4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n")
            f.write(" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
            f.write("4,3,3,-;NVRM: Xid (PCI:0000:3b:00): 4")  # half a record: waits for the newline
            f.flush()
            assert eventually(lambda: len(seen) >= 1, 10.0)
            f.write("8, pid=1, name=a, DBE\n")
        assert eventually(lambda: len(seen) >= 2, 10.0)
    finally:
        reader.stop()
    assert [r.seq for r in seen] == [2, 3]
    assert seen[1].message.endswith("48, pid=1, name=a, DBE")


def test_reader_starts_over_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("6,1,1,-;first record\n")
    seen: list[int] = []
    reader = KmsgReader(path, lambda r: seen.append(r.seq), from_start=True, poll_seconds=0.01)
    reader.start()
    try:
        assert eventually(lambda: seen == [1], 10.0)
        path.write_text("6,2,2,-;x\n")  # shorter than what was read: the file was truncated and rewritten
        assert eventually(lambda: seen == [1, 2], 10.0)
    finally:
        reader.stop()


def test_reader_survives_a_missing_file_and_a_failing_consumer(tmp_path: Path) -> None:
    path = tmp_path / "later"
    calls: list[int] = []

    def flaky(r: KmsgRecord) -> None:
        calls.append(r.seq)
        raise RuntimeError("consumer bug")

    reader = KmsgReader(path, flaky, from_start=True, poll_seconds=0.01)
    reader.start()
    try:
        assert eventually(lambda: reader.errors >= 1, 10.0)
        assert reader.last_error is not None
    finally:
        reader.stop()
    path.write_text("6,1,1,-;a\n6,2,2,-;b\n")
    reader = KmsgReader(path, flaky, from_start=True, poll_seconds=0.01)
    reader.start()
    try:
        assert eventually(lambda: calls == [1, 2], 10.0)
    finally:
        reader.stop()


def test_device_reading_survives_overwritten_records_and_long_records() -> None:
    """The character-device path, driven by a scripted read(): EPIPE (records overwritten before we read them)
    is counted and skipped, EINVAL (record longer than the buffer) grows the buffer, EAGAIN waits. The test does not
    write to the real /dev/kmsg: fake NVRM lines there would reach every log monitor on the machine."""
    import errno
    import os

    seen: list[int] = []
    sizes: list[int] = []
    r, w = os.pipe()

    class Scripted(KmsgReader):
        script: list[object] = [
            b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE\n",
            OSError(errno.EPIPE, "Broken pipe"),
            BlockingIOError(),
            OSError(errno.EINVAL, "Invalid argument"),
            b"4,9,9,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n SUBSYSTEM=pci\n",
        ]

        def _read(self, fd: int, size: int) -> bytes:  # type: ignore[override]
            sizes.append(size)
            if not self.script:
                self._stop.set()
                return b""
            item = self.script.pop(0)
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytes)
            return item

    reader = Scripted(Path("/dev/kmsg"), lambda rec: seen.append(rec.seq), from_start=True, poll_seconds=0.01)
    try:
        reader._follow_device(r)
    finally:
        os.close(r)
        os.close(w)
    assert seen == [1, 9]
    assert reader.overwritten == 1
    assert sizes[-1] == 4 * sizes[0]
