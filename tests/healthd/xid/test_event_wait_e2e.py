"""The daemon's NVML event path under a stuck driver wait: the event the stuck wait finally returns is not lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def _active(d: DaemonProcess, code: str, gpu: int) -> bool:
    out = d.xpuctl("faults", "list", "--state", "active", "--gpu", str(gpu))
    return code in out.stdout


def test_an_event_returned_by_a_stuck_wait_becomes_a_fault(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        assert d.xpuctl("simulate", "inject", "hang", "--gpu", "0", "call=wait_event").returncode == 0
        # past the wait's deadline (1 s wait + 0.3 s read deadline): the events lane is declared stuck
        wait_until(lambda: "stuck" in d.get("/healthz")[1], "the events lane reported stuck", 15.0, step=0.1)
        for gpu, code in ((2, "79"), (5, "48")):
            injected = d.xpuctl("simulate", "inject", "xid", "--gpu", str(gpu), f"code={code}")
            assert injected.returncode == 0, injected.stderr
        time.sleep(0.5)
        assert not _active(d, "xid_79", 2), "nothing is read while the wait is stuck"
        assert d.xpuctl("simulate", "clear", "--gpu", "0").returncode == 0
        # the stuck wait returns XID 79 after its caller gave up; the next wait must hand it on
        wait_until(lambda: _active(d, "xid_79", 2), "XID 79 on GPU 2 recorded", 20.0, step=0.2)
        wait_until(lambda: _active(d, "xid_48", 5), "XID 48 on GPU 5 recorded", 20.0, step=0.2)
