"""The daemon as a process: metrics for all cards, /healthz, fault injection with xpuctl, a hung card."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.exporter.collectors.test_card_metrics import value
from tests.support.daemon_process import DaemonProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def scrape_if(d: DaemonProcess, check: Callable[[str], bool]) -> str | None:
    text = d.metrics()
    return text if check(text) else None


def test_metrics_show_all_simulated_gpus(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        text = d.metrics()
        for gpu in range(8):
            assert value(text, "xpu_gpu_up", gpu=str(gpu)) == 1
        assert value(text, "xpu_backend_info", backend="simulated:h200x8") == 1
        status, body = d.get("/")
        assert status == 200 and "/metrics" in body
        assert d.get("/nope")[0] == 404


def test_hung_gpu_does_not_stall_scrapes_or_other_gpus(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        out = d.xpuctl("simulate", "inject", "hang", "--gpu", "3", "call=sample")
        assert out.returncode == 0, out.stderr
        text = wait_until(
            lambda: scrape_if(d, lambda t: value(t, "xpu_gpu_up", gpu="3") == 0), "GPU 3 down", 15.0, step=0.1
        )
        assert value(text, "xpu_gpu_sample_failure", gpu="3", code="timeout") == 1
        assert value(text, "xpu_backend_call_timeouts_total", call="sample") == 1
        before = value(text, "xpu_gpu_last_sample_timestamp_seconds", gpu="0") or 0.0
        stuck_before = value(text, "xpu_gpu_last_sample_timestamp_seconds", gpu="3")
        # the other cards keep being sampled while card 3 is stuck; every scrape answers (5 s client timeout)
        text = wait_until(
            lambda: scrape_if(d, lambda t: (value(t, "xpu_gpu_last_sample_timestamp_seconds", gpu="0") or 0) > before),
            "GPU 0 sampled again",
            15.0,
            step=0.1,
        )
        assert all(value(text, "xpu_gpu_up", gpu=str(g)) == 1 for g in range(8) if g != 3)
        assert value(text, "xpu_gpu_last_sample_timestamp_seconds", gpu="3") == stuck_before
        assert d.get("/healthz")[0] == 200, "a stuck card is reported as data; the daemon itself is healthy"

        out = d.xpuctl("simulate", "clear", "--gpu", "3")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: value(d.metrics(), "xpu_gpu_up", gpu="3") == 1, "GPU 3 up again", 15.0, step=0.1)
        assert d.stop() == 0
    assert not (tmp_path / "healthd.sock").exists(), "socket removed on a clean stop"


def test_xpuctl_reports_bad_input_clearly(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        out = d.xpuctl("simulate", "inject", "nosuchfault")
        assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stderr and "unknown fault kind" in out.stderr
        out = d.xpuctl("simulate", "inject", "xid", "--gpu", "42", "code=79")
        assert out.returncode == 1 and "gpu 42 does not exist" in out.stderr
        out = d.xpuctl("simulate", "inject", "xid", "code=abc")
        assert out.returncode == 1 and "must be an integer" in out.stderr
        out = d.xpuctl("simulate", "inject", "xid", "notapair")
        assert out.returncode == 2
        assert d.get("/healthz")[0] == 200, "the daemon survives bad requests"


def test_xpuctl_without_daemon_says_so(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    out = d.xpuctl("--timeout", "1", "simulate", "kinds")
    assert out.returncode == 1 and "cannot reach xpu-healthd" in out.stderr


def test_healthz_reports_backend_down(tmp_path: Path) -> None:
    scenario = tmp_path / "broken.toml"
    # a scenario file is validated at start: a bad one is a clear startup error, not a traceback
    scenario.write_text("[node]\nname = 'x'\n")
    d = DaemonProcess(tmp_path, scenario=str(scenario))
    with pytest.raises(RuntimeError, match="missing key"):
        d.start(ready_timeout=20)
    d.stop()


@pytest.mark.skipif(bool(os.environ.get("XPU_TEST_REAL_NVML")), reason="a machine with a GPU does not fall back")
def test_no_gpu_and_no_config_runs_the_simulated_node_and_says_so(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path, scenario=None, use_config=False) as d:
        text = d.metrics()
        assert value(text, "xpu_backend_info", backend="simulated:h200x8") == 1
        assert value(text, "xpu_gpus") == 8
    log = (tmp_path / "daemon.log").read_text()
    assert "running the simulated h200x8 node" in log
