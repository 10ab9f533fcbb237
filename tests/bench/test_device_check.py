"""bench/device_check.py without a GPU: its checks and its orchestration, with the simulated daemon in place of the
real one and stand-ins for PyTorch and nvidia-smi. The real run needs an NVIDIA machine (bench/device_check.sh).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import device_check, device_report
from bench.daemon_bench import DaemonRun
from bench.scenarios import scaled

pytestmark = pytest.mark.e2e

GOOD = """# HELP xpu_backend_info The GPU backend.
xpu_backend_info{backend="nvml",driver_version="580.159.04",nvml_version="13",cuda_driver_version="13000"} 1.0
xpu_backend_up 1.0
xpu_gpu_up{gpu="0",uuid="GPU-a"} 1.0
xpu_collector_success{collector="card"} 1.0
xpu_backend_call_timeouts_total{call="sample"} 0.0
"""


def test_health_problems_accepts_a_healthy_real_backend() -> None:
    assert device_check.health_problems(GOOD) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('backend="nvml"', 'backend="simulated:h200x8"'), "backend=nvml"),
        (('xpu_gpu_up{gpu="0",uuid="GPU-a"} 1.0', 'xpu_gpu_up{gpu="0",uuid="GPU-a"} 0.0'), "xpu_gpu_up"),
        (('timeouts_total{call="sample"} 0.0', 'timeouts_total{call="sample"} 2.0'), "timeouts"),
        (("xpu_backend_up 1.0", "xpu_backend_up 0.0"), "xpu_backend_up"),
        (('{collector="card"} 1.0', '{collector="card"} 0.0'), "collector_success"),
    ],
)
def test_health_problems_flags_each_bad_signal(change: tuple[str, str], expected: str) -> None:
    problems = device_check.health_problems(GOOD.replace(*change))
    assert len(problems) == 1 and expected in problems[0]


def test_health_problems_flags_active_fault_series_only_when_nonzero() -> None:
    assert device_check.health_problems(GOOD + 'xpu_health_faults_active{gpu="0"} 0.0\n') == []
    problems = device_check.health_problems(GOOD + 'xpu_health_faults_active{gpu="0"} 1.0\n')
    assert problems == ['fault series xpu_health_faults_active{gpu="0"} = 1']


def _simulated_daemon(tmp: Path) -> Any:
    def start(root: Path, interval: float | None) -> DaemonRun:
        run = DaemonRun(1, 2, tmp / root.name, interval=interval or 0.3)
        run.start()
        run.wait_ready(60)
        return run

    return start


def test_step_daemon_on_the_simulated_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_check, "start_real_daemon", _simulated_daemon(tmp_path))
    card = scaled(1, 2).cards[0]
    memory_mib = scaled(1).memory_total_bytes / 2**20
    monkeypatch.setattr(device_check, "nvidia_smi", lambda query: [["0", card.uuid, f"{memory_mib:.0f}"]])
    out = tmp_path / "out"
    out.mkdir()
    result = device_check.step_daemon(1.5, tmp_path / "work", out)
    # the simulated backend is not nvml: exactly that is reported, and the run is not OK
    assert result["problems"] == ["xpu_backend_info does not say backend=nvml (running on a simulation?)"]
    assert result["ok"] is False
    assert result["nvidia_smi_mismatches"] == []
    assert result["gpus"] == 1 and result["scrapes"] >= 1 and result["rss_mib"] > 10
    assert (out / "daemon-real.log").stat().st_size > 0


def test_step_daemon_reports_a_memory_size_nvidia_smi_disagrees_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_check, "start_real_daemon", _simulated_daemon(tmp_path))
    card = scaled(1).cards[0]
    monkeypatch.setattr(device_check, "nvidia_smi", lambda query: [["0", card.uuid, "1024"]])
    out = tmp_path / "out"
    out.mkdir()
    result = device_check.step_daemon(0.5, tmp_path / "work", out)
    assert len(result["nvidia_smi_mismatches"]) == 1 and "1024 MiB" in result["nvidia_smi_mismatches"][0]


def test_step_throughput_compares_phases_and_watches_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_check, "start_real_daemon", _simulated_daemon(tmp_path))
    rates = iter([600.0, 590.0, 580.0, 610.0])

    def fake_matmul(seconds: float, watch: Any = None) -> dict[str, float]:
        if watch is not None:
            watch()
        return {"tflops": next(rates), "products": 1.0, "seconds": seconds, "pid": 1.0}

    monkeypatch.setattr(device_check, "matmul", fake_matmul)
    phases = device_check.step_throughput(0.1, tmp_path)
    assert list(phases) == ["alone", "daemon_default_5s", "daemon_10x_0.5s", "alone_again"]
    assert phases["daemon_10x_0.5s"]["vs_alone"] == pytest.approx(580.0 / 605.0)
    # the simulated card runs two processes: the watcher saw them and the card's utilization through /metrics
    assert phases["daemon_default_5s"]["processes_max"] == 2.0
    assert 0.0 < phases["daemon_default_5s"]["utilization_max"] <= 1.0


def test_step_peers_records_what_it_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_check, "start_real_daemon", _simulated_daemon(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    peers = device_check.step_peers(1.0, tmp_path, out)
    ours = peers["xpu-healthd"]
    assert ours["rss_mib"] > 10 and ours["scrape_p50_ms"] > 0 and ours["samples"] >= 1
    assert "error" in peers["nvitop-exporter"]
    assert "error" in peers["nvidia-smi --query-gpu"] or peers["nvidia-smi --query-gpu"]["calls"] == 30


def test_run_with_rusage_reports_the_childs_own_usage() -> None:
    rc, wall, cpu, maxrss = device_check.run_with_rusage([sys.executable, "-c", "x = bytearray(64 << 20)"])
    assert rc == 0 and wall > 0 and cpu > 0
    assert maxrss > 64 * 1024  # KiB: the 64 MiB it touched


def test_summary_renders_a_full_result() -> None:
    gpu = {
        "gpu": 0,
        "mig": False,
        "nvml_calls": 17,
        "backend_wall_ms": 1.2,
        "raw_wall_ms": 1.0,
        "overhead_ratio": 1.2,
        "backend_cpu_ms": 1.1,
        "raw_cpu_ms": 0.9,
    }
    phase = {"tflops": 650.0, "vs_alone": 1.0}
    results = {
        "when": "2026-11-29 23:00 UTC",
        "gpu": "NVIDIA H200, 580.159.04",
        "contract_rc": 0,
        "settings_unchanged": True,
        "steps": {
            "daemon": {
                "gpus": 1,
                "ok": True,
                "problems": [],
                "cpu_share_percent": 0.4,
                "rss_mib": 60.0,
                "scrape_p50_ms": 2.0,
                "scrape_p99_ms": 4.0,
                "call_errors": {},
            },
            "overhead": {
                "gpus": [gpu],
                "sampler": {"cycle_wall_ms": 2, "raw_serial_wall_ms": 1, "overhead_ratio_wall": 2},
            },
            "throughput": {
                "alone": phase,
                "daemon_default_5s": {**phase, "daemon_cpu_share_percent": 0.5, "utilization_max": 1.0},
            },
            "peers": {
                "xpu-healthd": {"scrape_p50_ms": 2, "scrape_p99_ms": 3, "cpu_per_sample_ms": 5, "rss_mib": 60},
                "nvitop-exporter": {"error": "ModuleNotFoundError"},
            },
        },
    }
    text = device_report.summary(json.loads(json.dumps(results)))
    assert "contract tests on real NVML: PASS" in text
    assert "daemon minute (1 GPU): OK" in text
    assert "1.20x, 17 calls" in text
    assert "nvitop-exporter          ERROR ModuleNotFoundError" in text
    errors = device_report.summary({"when": "x", "contract_rc": 1, "steps": {"daemon": {"error": "boom"}}})
    assert "FAIL (rc 1)" in errors and "daemon minute: ERROR boom" in errors
