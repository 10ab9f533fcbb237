"""Only the driver's own reports count: NVRM formats from NVIDIA's sources, and text that imitates them (user
writes to /dev/kmsg, product strings, split reports) counting for nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.xid.kmsg import (
    KmsgRecord,
    NvrmDecoder,
    NvrmEvent,
    escape,
    format_record,
    parse_line,
    parse_nvrm,
    parse_record,
    unescape,
)
from tests.support.kmsg_records import kernel_record

# ----- what counts as the driver's report ---------------------------------------------------------------------
#
# The driver's format strings, from NVIDIA's open-gpu-kernel-modules (github.com/NVIDIA/open-gpu-kernel-modules):
#   krcReportXid in src/nvidia/src/kernel/gpu/rc/kernel_rc.c prints
#     "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s\n"                      (no MIG attribution)
#     "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, %s\n"           (GPU instance)
#     "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s\n"
#   with pid "'<unknown>'" and name "<unknown>" when no channel is to blame;
#   _gpuGenerateErrorLog_GA100 (src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_ga100.c) documents the older
#     "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No";
#   osHandleGpuLost (src/nvidia/arch/nvalloc/unix/src/osinit.c) logs XID 79 and then
#     "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus." through NV_DEV_PRINTF.
# Public dmesg samples of the same shapes: the GPUd README (github.com/leptonai/gpud, components/accelerator/
# nvidia/error/xid/README.md) quotes "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008,
# errorString CTX SWITCH TIMEOUT, Info 0x58005"; older drivers print "NVRM: Xid (0000:03:00): 14, Channel 00000001"
# (the same README's test table) and "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus." (a Ubuntu
# nvidia-bug-report.log quoted in github.com/congphase/my-t450s, troubleshoot_log.md).

REAL_FORMATS = [
    (
        "MIG: GPU and compute instance",
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 13, pid=4242, name=python3, Graphics SM Warp Exception",
        NvrmEvent("xid", "0000:3b:00", 13, 4242, "python3", "Graphics SM Warp Exception", None, 2, 1),
    ),
    (
        "MIG: GPU instance only, pid without name (Ampere error containment)",
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        NvrmEvent("xid", "0000:01:00", 94, 7194, None, "Contained: CE User Channel (0x9). RST: No, D-RST: No", None, 5),
    ),
    (
        "no process known",
        "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        NvrmEvent("xid", "0000:18:00", 79, None, None, "GPU has fallen off the bus."),
    ),
    (
        "newer form with Ch",
        "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
        "TIMEOUT, Info 0x58005",
        NvrmEvent(
            "xid",
            "0000:cb:00",
            109,
            1797828,
            "pt_main_thread",
            "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        ),
    ),
    (
        "old driver, address without PCI:",
        "NVRM: Xid (0000:18:00): 13, pid=1, name=a, Graphics Exception",
        NvrmEvent("xid", "0000:18:00", 13, 1, "a", "Graphics Exception"),
    ),
    (
        "old driver, no pid",
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        NvrmEvent("xid", "0000:01:00", 79, None, None, "GPU has fallen off the bus."),
    ),
    (
        "osHandleGpuLost's device line",
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        NvrmEvent("fallen_off_bus", "0000:01:00", 79, text="GPU 0000:01:00.0: GPU has fallen off the bus."),
    ),
]


@pytest.mark.parametrize(("case", "message", "expected"), REAL_FORMATS, ids=[c[0] for c in REAL_FORMATS])
def test_every_format_the_driver_prints(case: str, message: str, expected: NvrmEvent) -> None:
    assert NvrmDecoder().feed(kernel_record(message)) == expected


# Look-alikes that must raise nothing. The first is what a USB device can put in the kernel log: the kernel
# prints a device's Product string verbatim at facility kern ("usb 1-1: Product: %s", drivers/usb/core/hub.c).
SPOOFED_BY_THE_TEXT = [
    "usb 1-1: Product: NVRM: Xid (PCI:0000:18:00): 79, spoof",
    "usb 1-1: Manufacturer: NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "input: NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2335) installed in this system has fallen off the bus",
    " NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, leading space",
    "NVRM:Xid (PCI:0000:18:00): 79, pid=1, name=a, no space after the prefix",
    "nvrm: Xid (PCI:0000:18:00): 79, pid=1, name=a, lower case",
    'audit: comm="NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a"',
]


@pytest.mark.parametrize("message", SPOOFED_BY_THE_TEXT)
def test_the_prefix_anywhere_but_the_start_counts_for_nothing(message: str) -> None:
    decoder = NvrmDecoder()
    assert decoder.feed(kernel_record(message, priority=6)) is None
    assert parse_nvrm(message) is None
    if "NVRM:" in message:
        assert decoder.rejected == 1


GENUINE = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "line",
    [
        f"12,900,1000,-;{GENUINE}",  # `echo ... > /dev/kmsg`: facility user (1), level warning
        f"14,901,1000,-;{GENUINE}",  # user.info
        f"30,902,1000,-;{GENUINE}",  # `echo '<28>...'`: facility daemon (3)
        f"191,903,1000,-;{GENUINE}",  # local7.debug
        f"<12>[ 5.000001] {GENUINE}",  # the same record as `dmesg --raw` prints it
        f"<13>{GENUINE}",
    ],
)
def test_user_space_writes_to_dev_kmsg_count_for_nothing(line: str) -> None:
    """The kernel gives a /dev/kmsg write facility user unless the writer names another non-zero one; facility 0
    cannot be chosen (kernel/printk/printk.c, devkmsg_write), so the facility tells the driver's lines apart."""
    record = parse_line(line)
    assert record is not None and not record.from_kernel
    decoder = NvrmDecoder()
    assert decoder.feed(record) is None
    assert decoder.rejected == 1
    same_from_the_kernel = parse_line(f"3,904,1000,-;{GENUINE}")
    assert same_from_the_kernel is not None
    assert decoder.feed(same_from_the_kernel) == NvrmEvent("xid", "0000:18:00", 79, text="GPU has fallen off the bus.")


def test_a_user_record_between_the_halves_of_a_split_report_changes_nothing() -> None:
    decoder = NvrmDecoder()
    assert (
        decoder.feed(kernel_record("NVRM: The NVIDIA GPU 0000:9a:00.0 (PCI ID: 10de:28a0) installed in this", 3))
        is None
    )
    assert (
        decoder.feed(kernel_record("NVRM: system has fallen off the bus and is not responding to commands.", 12))
        is None
    )
    event = decoder.feed(kernel_record("NVRM: system has fallen off the bus and is not responding to commands.", 3))
    assert event is not None and (event.kind, event.pci) == ("fallen_off_bus", "0000:9a:00")
    # a tail with no head before it is not a report
    assert (
        NvrmDecoder().feed(kernel_record("NVRM: system has fallen off the bus and is not responding to commands."))
        is None
    )


def test_huge_numbers_in_the_header_are_not_a_record() -> None:
    assert parse_record("1" * 5000 + ",1,1,-;NVRM: x") is None
    assert parse_line("<" + "4" * 50 + ">NVRM: x") is None


# The card-probe report (osapi.c: "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\n" "NVRM: (PCI ID: %04x:%04x) installed
# in this system has\n" "NVRM: fallen off the bus and is not responding to commands.\n") is one printk of three
# lines. dmesg shows it as in github.com/NVIDIA/NVSentinel/issues/155 (driver 570.158.01, GPU 0000:b3:00.0, PCI ID
# 10de:26b5); /dev/kmsg keeps it one record and writes the line breaks as \x0a.
PROBE_REPORT = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands."
)
PROBE_TEXT = (
    "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not "
    "responding to commands."
)


def test_a_report_printed_as_several_lines_is_one_record_on_dev_kmsg() -> None:
    line = format_record(KmsgRecord(3, 50, 1843308145, "-", PROBE_REPORT))
    assert "\\x0aNVRM: (PCI ID: 10de:26b5)" in line  # as the kernel writes it
    record = parse_record(line)
    assert record is not None and record.message == PROBE_REPORT
    assert NvrmDecoder().feed(record) == NvrmEvent("fallen_off_bus", "0000:b3:00", 79, text=PROBE_TEXT)


def test_the_same_report_one_line_per_record() -> None:
    decoder = NvrmDecoder()
    lines = PROBE_REPORT.split("\n")
    assert decoder.feed(kernel_record(lines[0], 3)) is None
    assert decoder.feed(kernel_record(lines[1], 3)) is None
    assert decoder.feed(kernel_record(lines[2], 3)) == NvrmEvent("fallen_off_bus", "0000:b3:00", 79, text=PROBE_TEXT)
    # without the PCI ID line, as NVSentinel's handler also expects it
    short = NvrmDecoder()
    assert short.feed(kernel_record("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: installed in this system has")) is None
    event = short.feed(kernel_record("NVRM: fallen off the bus and is not responding to commands."))
    assert event is not None and event.pci == "0000:b3:00"


def test_a_product_string_with_a_line_break_stays_one_record_and_counts_for_nothing() -> None:
    """A USB device chooses its strings, line breaks included; on /dev/kmsg they stay inside its own record."""
    fake = "usb 1-1: Product: x\nNVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, spoof"
    record = parse_record(format_record(KmsgRecord(6, 7, 7, "-", fake)))
    assert record is not None and record.message == fake
    decoder = NvrmDecoder()
    assert decoder.feed(record) is None
    assert decoder.rejected == 1


def test_a_process_name_cannot_add_a_second_report_to_a_genuine_one() -> None:
    """A process may name itself anything (prctl PR_SET_NAME), line breaks included; only the first line counts."""
    line = "NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=x\nNVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=y, GPU lost"
    event = NvrmDecoder().feed(kernel_record(line))
    assert event is not None and (event.kind, event.pci, event.xid) == ("xid", "0000:18:00", 13)
    assert "0000:2a:00" not in event.text and "79" not in event.text


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_kmsg_escaping_round_trips(text: str) -> None:
    escaped = escape(text)
    assert escaped.isascii() and "\n" not in escaped
    assert unescape(escaped) == text
