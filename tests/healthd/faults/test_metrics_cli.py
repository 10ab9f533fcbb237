"""Fault metrics (checked with promtool), the [faults]/[hook] config sections, and xpuctl faults/health."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from healthd.cli import main as xpuctl
from healthd.daemon.config import ConfigError, parse_config
from healthd.faults.metrics import FaultMetricsCollector
from healthd.findings import Action, CheckStatus, Severity
from tests.support.clock import FakeClock
from tests.support.faults_helpers import GPU0, GPU1, DaemonThread, ecc_finding, ecc_report, make_engine, xid
from tests.support.paths import REPO


class _Adapter:
    def __init__(self, collector: FaultMetricsCollector) -> None:
        self._c = collector

    def collect(self) -> Any:
        return self._c.collect(None, 0.0)  # type: ignore[arg-type]  # the fault collector ignores the snapshot


def test_fault_metrics(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, FakeClock(), open_after_evaluations=1)
    engine.accept_report(ecc_report(ecc_finding(GPU0), status={1: CheckStatus.UNKNOWN}))
    for _ in range(3):
        engine.accept_event(xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE))
    engine.accept_event(xid(13, GPU0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Adapter(FaultMetricsCollector(engine, node_name="gpu-node-7")))
    text = generate_latest(registry).decode()
    ids = {f.code: f.id for f in engine.active_faults()}
    assert 'xpu_health_check_status{check="ecc",gpu="0",status="failed",uuid="' + GPU0.uuid + '"} 1.0' in text
    assert 'xpu_health_check_status{check="ecc",gpu="1",status="unknown",uuid="' + GPU1.uuid + '"} 1.0' in text
    assert 'xpu_health_check_status{check="ecc",gpu="1",status="ok",uuid="' + GPU1.uuid + '"} 0.0' in text
    # per fault: the alert rules need gpu and uuid to say which card, and carry the fault id and the node name on
    # to the webhook, which uses them as the hook's idempotency key and node (the same as the daemon's own push)
    assert (
        f'xpu_faults_active{{action="reboot_node",code="xid_79",fault_id="{ids["xid_79"]}",gpu="1",'
        f'node="gpu-node-7",severity="fatal",uuid="{GPU1.uuid}"}} 1.0' in text
    )
    assert (
        'xpu_faults_active{action="reset_gpu",code="ecc_uncorrectable_volatile",'
        f'fault_id="{ids["ecc_uncorrectable_volatile"]}",gpu="0",node="gpu-node-7",severity="critical",'
        f'uuid="{GPU0.uuid}"}} 1.0' in text
    )
    first_seen = {f.code: f.first_seen for f in engine.active_faults()}["xid_79"]
    (opened,) = [
        line
        for line in text.splitlines()
        if line.startswith("xpu_fault_opened_timestamp_seconds{") and f'fault_id="{ids["xid_79"]}"' in line
    ]
    assert float(opened.rsplit(" ", 1)[1]) == first_seen
    assert f'xpu_xid_errors_total{{gpu="1",uuid="{GPU1.uuid}",xid="79"}} 3.0' in text
    assert "xpu_faults_journal_seq 3.0" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_config_sections() -> None:
    config = parse_config(
        {
            "faults": {"dedup_window_seconds": 30, "escalation_reboots": 3, "boot_id_path": "/tmp/boot_id"},
            "hook": {"endpoints": ["unix:/run/hook.sock", "10.0.0.5:7000"], "min_action": "reboot_node"},
        }
    )
    assert config.faults.dedup_window_seconds == 30.0
    assert config.faults.escalation_reboots == 3
    assert config.hook.endpoints == ("unix:/run/hook.sock", "10.0.0.5:7000")
    for bad, message in [
        ({"faults": {"dedup": 1}}, "faults.dedup: unknown option"),
        ({"faults": {"escalation_reboots": 1.5}}, "faults.escalation_reboots: expected an integer"),
        ({"faults": {"open_after_evaluations": 0}}, "faults.open_after_evaluations: must be between"),
        ({"faults": {"boot_id_path": "boot_id"}}, "faults.boot_id_path: must be an absolute path"),
        ({"hook": {"endpoints": ["unix:relative"]}}, "hook.endpoints: unix socket path must be absolute"),
        ({"hook": {"min_action": "panic"}}, "hook.min_action: must be one of"),
        ({"hook": {"backoff_initial_seconds": 10, "backoff_max_seconds": 1}}, "hook.backoff_max_seconds"),
        ({"hook": "x"}, "hook: expected a table"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_config(bad)
        assert str(err.value).startswith(message), err.value


def test_xpuctl_faults_and_health(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with DaemonThread(tmp_path, tmp_path / "s.sock", open_after_evaluations=1) as d:
        d.engine.accept_report(ecc_report(ecc_finding(GPU0)))
        d.engine.accept_event(xid(79, GPU1, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        sock = ["--socket", d.address]
        capsys.readouterr()  # the server's own log lines
        assert xpuctl([*sock, "faults", "list", "--min-action", "reboot_node"]) == 0
        header, *rows = capsys.readouterr().out.splitlines()
        assert header.split()[:4] == ["ID", "STATE", "GPU", "CHECK/CODE"]
        assert len(rows) == 1
        assert rows[0].split()[3:6] == ["xid/xid_79", "fatal", "reboot_node"]
        assert xpuctl([*sock, "faults", "list", "--min-action", "soon"]) == 2
        assert xpuctl([*sock, "faults", "watch", "--after", "0", "--count", "2"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [ln.split()[0] for ln in lines] == ["seq=1", "seq=2"]
        assert xpuctl([*sock, "health", "--exit-code"]) == 1
        out = capsys.readouterr().out
        assert out.splitlines()[0].split() == ["CHECK", "GPU0", "GPU1"]
        assert out.splitlines()[1].split() == ["ecc", "failed", "ok"]
        assert "active faults: 2" in out


def test_xpuctl_watch_resumes_after_the_daemon_restarts(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    sock = tmp_path / "run" / "healthd.sock"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with DaemonThread(tmp_path, sock) as d:
        d.engine.accept_event(xid(13))
        d.engine.accept_event(xid(14))
        watcher = subprocess.Popen(
            [sys.executable, "-m", "healthd.cli", "--socket", f"unix:{sock}", "faults", "watch", "--count", "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert watcher.stdout is not None
        lines = [watcher.stdout.readline(), watcher.stdout.readline()]
    # the daemon is gone; the watcher keeps trying, then resumes after seq 2 on the new daemon
    with DaemonThread(tmp_path, sock) as d:
        d.engine.accept_event(xid(15))
        d.engine.accept_event(xid(16))
        out, err = watcher.communicate(timeout=60)
    lines += out.splitlines()
    assert [ln.split()[0] for ln in lines if ln.strip()] == ["seq=1", "seq=2", "seq=3", "seq=4"]
    assert watcher.returncode == 0, err
    assert "resuming after seq 2" in err
