"""Probes wired into the daemon: injected faults become faults in the journal, the Health API and metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.exporter.collectors.test_card_metrics import value
from tests.support.daemon_process import DaemonProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_injected_faults_reach_the_fault_list_and_metrics(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        for args in (
            ("xid", "--gpu", "3", "code=79"),
            ("xid", "--gpu", "2", "code=13"),
            ("nvlink_down", "--gpu", "1", "link=4"),
        ):
            out = d.xpuctl("simulate", "inject", *args)
            assert out.returncode == 0, out.stderr

        def listed() -> dict[str, dict[str, Any]] | None:
            out = d.xpuctl("faults", "list", "--json")
            by_code = {f["code"]: f for f in json.loads(out.stdout)["faults"]} if out.returncode == 0 else {}
            return by_code if {"xid_79", "xid_13", "nvlink_down"} <= set(by_code) else None

        faults = wait_until(listed, "the three faults listed", 20, step=0.1)
        assert faults["xid_79"]["gpu"]["index"] == 3 and faults["xid_79"]["severity"] == "fatal"
        assert faults["xid_13"]["action"] == "restart_app", "an application XID never asks for more than an app restart"

        # /metrics is rendered when a sample is published: the faults show from the next one on
        def rendered() -> str | None:
            text = d.metrics()
            return text if value(text, "xpu_faults_active", code="nvlink_down") is not None else None

        text = wait_until(rendered, "the faults on /metrics", 20, step=0.1)
        assert value(text, "xpu_xid_errors_total", gpu="3", xid="79") == 1
        assert value(text, "xpu_faults_active", code="nvlink_down") == 1
        health = d.xpuctl("health")
        assert health.returncode == 0
        nvlink_row = next(line for line in health.stdout.splitlines() if line.startswith("nvlink"))
        assert "failed" in nvlink_row


def test_healthy_simulated_node_raises_no_fault(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        wait_until(
            lambda: value(d.metrics(), "xpu_sampler_cycle_seconds") is not None, "a sampler cycle", 15.0, step=0.1
        )
        # let several sampling cycles and probe evaluations pass
        first = value(d.metrics(), "xpu_backend_calls_total", call="sample") or 0
        wait_until(
            lambda: (value(d.metrics(), "xpu_backend_calls_total", call="sample") or 0) >= first + 8 * 5,
            "five more cycles",
            15.0,
            step=0.1,
        )
        out = d.xpuctl("faults", "list")
        assert out.returncode == 0
        assert "active" not in out.stdout, out.stdout
