"""Spoofed XID lines through the whole pipeline: kernel log file -> daemon -> faults -> replacement hook.

The daemon runs on the simulated node with its kernel-log source pointed at a file written in /dev/kmsg's record
format. Look-alike lines (a USB device's Product string, user-space writes to /dev/kmsg) go in first, then one real
driver line; the real one must become a fault and reach the hook, the look-alikes nothing at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.xid.kmsg import KmsgRecord, format_record, format_xid
from tests.support.daemon_process import DaemonProcess
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

GPU0_PCI = "0000:18:00"  # h200x8: GPU 0 is 00000000:18:00.0, GPU 3 5D, GPU 5 AB
GPU3_PCI = "0000:5d:00"
GPU5_PCI = "0000:ab:00"


def _append(path: Path, *records: KmsgRecord) -> None:
    with path.open("a") as f:
        for record in records:
            f.write(format_record(record) + "\n")


def _fault_lines(d: DaemonProcess) -> list[str]:
    """Each XID fault as "CODE gpu=INDEX"."""
    out = d.xpuctl("faults", "list", "--json")
    assert out.returncode == 0, out.stderr
    faults = json.loads(out.stdout)["faults"]
    return [f"{f['code']} gpu={f['gpu']['index']}" for f in faults if f["code"].startswith("xid_")]


def test_spoofed_xid_lines_reach_no_fault_and_no_hook(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    hook_sock = tmp_path / "hook.sock"
    received = tmp_path / "received.jsonl"
    hook = start_hook(f"unix:{hook_sock}", f"cat >> {received}; echo >> {received}", tmp_path / "hook.sqlite")
    config = (
        f'[host]\nkmsg_path = "{kmsg}"\n'
        f'[hook]\nendpoints = ["unix:{hook_sock}"]\nmin_action = "replace_node"\n'
        "backoff_initial_seconds = 0.1\nbackoff_max_seconds = 0.5\n"
    )
    try:
        with DaemonProcess(tmp_path, extra_config=config) as d:
            # 1. a real application XID (restart_app: below the hook's level) shows the reader is following
            _append(kmsg, KmsgRecord(4, 1, 10, "-", format_xid(GPU0_PCI, 13, "Graphics Exception", pid=7)))
            wait_until(lambda: any("xid_13" in line for line in _fault_lines(d)), "the xid_13 fault", 30, step=0.1)

            # 2. look-alikes of a fatal XID 79 on GPU 3
            fatal = format_xid(GPU3_PCI, 79, "GPU has fallen off the bus.")
            _append(
                kmsg,
                KmsgRecord(6, 2, 20, "-", f"usb 1-1: Product: NVRM: Xid (PCI:{GPU3_PCI}): 79, spoof"),
                KmsgRecord(6, 3, 21, "-", f"usb 1-1: Product: {fatal}"),
                KmsgRecord(12, 4, 22, "-", fatal),  # echo "$fatal" > /dev/kmsg
                KmsgRecord(30, 5, 23, "-", fatal),  # echo "<28>$fatal" > /dev/kmsg (facility daemon)
                KmsgRecord(12, 6, 24, "-", "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus."),
            )
            with kmsg.open("a") as f:  # lines with no record header at all
                f.write(f"{fatal}\n[ 12.345] {fatal}\n")

            # 3. the driver's own line for GPU 5, after the look-alikes: the reader handles lines in order
            _append(kmsg, KmsgRecord(3, 7, 30, "-", format_xid(GPU5_PCI, 79, "GPU has fallen off the bus.")))
            wait_until(
                lambda: received.exists() and received.read_text().strip(), "the hook to receive a fault", 60, step=0.1
            )

            lines = _fault_lines(d)
            assert len(lines) == 2, lines
            assert any("xid_79" in line and "gpu=5" in line for line in lines), lines
            assert not any("gpu=3" in line for line in lines), lines
            metrics = d.metrics()
            assert 'xpu_xid_errors_total{gpu="3"' not in metrics
    finally:
        stop_hook(hook)
    deliveries = [json.loads(line) for line in received.read_text().splitlines() if line.strip()]
    assert len(deliveries) == 1, deliveries
    assert deliveries[0]["fault"]["code"] == "xid_79"
    assert deliveries[0]["fault"]["gpu"]["index"] == 5
