"""The daemon process serves the Health API and the fault metrics, and survives SIGKILL with its journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import health_pb2 as pb
from healthd.api.v1 import health_pb2_grpc as pb_grpc
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.waiting import wait_until

ROOT = REPO


def _start(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "healthd.main", "--simulate", "h200x1", "--state-dir", str(tmp / "state"),
         "--grpc-listen", f"unix:{tmp / 'run' / 'd.sock'}", "--metrics-listen", f"127.0.0.1:{port}",
         "--log-level", "warning"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _node_health(address: str) -> object | None:
    try:
        with grpc.insecure_channel(address) as channel:
            return pb_grpc.HealthStub(channel).GetNodeHealth(pb.GetNodeHealthRequest(), timeout=2)
    except grpc.RpcError:
        return None


@pytest.mark.e2e
def test_daemon_serves_health_and_fault_metrics_and_survives_sigkill(tmp_path: Path) -> None:
    port = free_port()
    address = f"unix:{tmp_path / 'run' / 'd.sock'}"
    daemon = _start(tmp_path, port)
    try:
        wait_until(lambda: _node_health(address) is not None, "the daemon's Health service")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert "xpu_faults_journal_seq 0.0" in metrics
        assert 'xpu_collector_success{collector="faults"} 1.0' in metrics
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(30)
    assert (tmp_path / "state" / "faults.sqlite").exists()
    daemon = _start(tmp_path, port)  # a stale socket and an un-checkpointed WAL are left behind
    try:
        wait_until(lambda: _node_health(address) is not None, "the restarted daemon's Health service")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
