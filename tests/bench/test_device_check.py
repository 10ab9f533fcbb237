"""The device check's steps without a GPU: the daemon minute, matmul loss and peers on the simulated node (the same
code paths the real card runs, with the simulated daemon and a matmul that only sleeps), their health checks and
their summary lines. The whole check on the device machine's package set: test_device_rehearsal.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import check_daemon, check_peers, check_throughput, device_report
from bench.check_runner import Outcome
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
    assert check_daemon.health_problems(GOOD) == []
    assert check_daemon.health_problems(GOOD, "simulated") == ["xpu_backend_info does not say backend=simulated"]


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
    problems = check_daemon.health_problems(GOOD.replace(*change))
    assert len(problems) == 1 and expected in problems[0]


def test_health_problems_flags_active_fault_series_only_when_nonzero() -> None:
    assert check_daemon.health_problems(GOOD + 'xpu_health_faults_active{gpu="0"} 0.0\n') == []
    problems = check_daemon.health_problems(GOOD + 'xpu_health_faults_active{gpu="0"} 1.0\n')
    assert problems == ['fault series xpu_health_faults_active{gpu="0"} = 1']


def test_memory_sizes_are_compared_with_nvidia_smi() -> None:
    card = scaled(1).cards[0]
    mib = scaled(1).memory_total_bytes / 2**20
    text = f'xpu_gpu_memory_total_bytes{{gpu="0",uuid="{card.uuid}"}} {scaled(1).memory_total_bytes}\n'
    assert check_daemon.memory_mismatches(text, [["0", card.uuid, f"{mib:.0f}"]]) == []
    [wrong] = check_daemon.memory_mismatches(text, [["0", card.uuid, "1024"]])
    assert "vs nvidia-smi 1024 MiB" in wrong
    [absent] = check_daemon.memory_mismatches(text, [["0", "GPU-other", "1024"]])
    assert "not listed by nvidia-smi" in absent


def test_the_daemon_step_on_the_simulated_node_goes_through_the_api(tmp_path: Path) -> None:
    assert check_daemon.main(["--out", str(tmp_path), "--seconds", "1", "--rehearse"]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] is True and result["problems"] == [] and result["gpus"] == 1
    assert list(result["api"]) == ["health", "faults", "tdm_mode", "create", "get", "delete", "none_mode"]
    assert all(call["ok"] for call in result["api"].values())
    assert any("CUDA_MPS_PIPE_DIRECTORY" in line for line in result["partition"])
    # the daemon ran with the unit's umask and made its MPS directories itself: their modes are recorded
    modes = result["mps_dir_modes"]
    assert modes["run"].startswith("0755") and any(k.endswith("/pipe") for k in modes)
    assert result["scrapes"] >= 1 and result["rss_mib"] > 10
    assert (tmp_path / "d" / "daemon.log").stat().st_size > 0
    line = device_report.figure_line(Outcome("daemon", "", 90, "ok", figures=result))
    assert "backend simulated" in line and "problems: none" in line and "create" in line


def test_phase_rates_are_time_weighted_and_ratioed_to_the_alone_phases() -> None:
    rates = [(1.0, 0.5, 600.0), (1.5, 0.5, 600.0), (2.5, 0.5, 590.0), (3.0, 0.5, 580.0), (3.6, 0.5, 1.0)]
    assert check_throughput.mean_rate(rates, 0.5, 1.5) == pytest.approx(600.0)
    assert check_throughput.mean_rate(rates, 2.0, 3.0) == pytest.approx(585.0)
    assert check_throughput.mean_rate(rates, 2.1, 2.2) is None  # no whole interval inside
    assert check_throughput.mean_rate([(1.0, 0.5, None)], 0.0, 2.0) is None  # the dry run's lines


def test_the_throughput_step_runs_its_phases_beside_the_simulated_daemon(tmp_path: Path) -> None:
    assert check_throughput.main(["--out", str(tmp_path), "--seconds", "0.6", "--rehearse"]) == 0
    phases = json.loads((tmp_path / "result.json").read_text())["phases"]
    assert list(phases) == ["alone", "daemon_default_5s", "daemon_10x_0.5s", "alone_again"]
    assert all(p["tflops"] is None and p["vs_alone"] is None for p in phases.values())  # a sleeping matmul
    for label in ("daemon_default_5s", "daemon_10x_0.5s"):
        assert phases[label]["daemon_cpu_share_percent"] >= 0
        assert 0.0 < phases[label]["utilization_max"] <= 1.0  # the watcher read the daemon's /metrics
        assert phases[label]["processes_max"] == 2.0


def test_the_peers_step_measures_ours_and_skips_what_needs_a_driver(tmp_path: Path) -> None:
    assert check_peers.main(["--out", str(tmp_path), "--window", "1", "--rehearse"]) == 0
    peers = json.loads((tmp_path / "result.json").read_text())
    ours = peers["xpu-healthd"]
    assert ours["rss_mib"] > 10 and ours["scrape_p50_ms"] > 0 and ours["samples"] >= 1
    assert peers["nvitop-exporter"] == {"skipped": check_peers.NO_GPU}
    assert peers["nvidia-smi --query-gpu"] == {"skipped": check_peers.NO_GPU}


def test_run_with_rusage_reports_the_childs_own_usage() -> None:
    rc, wall, cpu, maxrss = check_peers.run_with_rusage([sys.executable, "-c", "x = bytearray(64 << 20)"])
    assert rc == 0 and wall > 0 and cpu > 0
    assert maxrss > 64 * 1024  # KiB: the 64 MiB it touched


def test_summary_lines_of_a_full_result() -> None:
    gpu = {"gpu": 0, "mig": False, "nvml_calls": 17, "overhead_ratio": 1.2}
    results = {
        "overhead": {"gpus": [gpu], "sampler": {"cycle_wall_ms": 2, "raw_serial_wall_ms": 1}},
        "throughput": {"phases": {"alone": {"tflops": 650.0, "vs_alone": 1.0}}},
        "peers": {"xpu-healthd": {"scrape_p50_ms": 2, "cpu_per_sample_ms": 5, "rss_mib": 60},
                  "nvitop-exporter": {"error": "ModuleNotFoundError"}},
        "mps": {"runs": [{"start": 0.03, "get_server_list": 0.001, "quit": 0.002}]},
    }  # fmt: skip
    lines = {name: device_report.figure_line(Outcome(name, "", 10, "ok", figures=r)) for name, r in results.items()}
    assert "backend/raw 1.20x (17 calls)" in lines["overhead"]
    assert lines["throughput"] == "alone 650.0 TFLOP/s (1.000)"
    assert "nvitop-exporter: ERROR ModuleNotFoundError" in lines["peers"]
    assert "start 30.0" in lines["mps"]


def test_a_figure_that_cannot_be_shown_falls_back_without_losing_the_summary() -> None:
    broken = Outcome("overhead", "", 10, "ok", tail=["last line"], figures={"gpus": [{"gpu": 0}]})
    assert device_report.figure_line(broken).startswith("(figures not shown: KeyError")
    missing = Outcome("gpm", "", 10, "failed", tail=["Traceback", "RuntimeError: no card"], figures=None)
    assert device_report.figure_line(missing) == "RuntimeError: no card"
    contract = Outcome("contract", "", 10, "ok", tail=["....", "======= 26 passed, 52 skipped in 3.21s ======="])
    assert device_report.figure_line(contract) == "26 passed, 52 skipped in 3.21s"
