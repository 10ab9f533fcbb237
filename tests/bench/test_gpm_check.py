"""bench/gpm_check.py (the GPM step of bench/device_check.sh) over the capture fake, so the real-card run has been
through its paths once: a card with GPM, one without, and a failing card."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from bench import gpm_check
from tests.support.nvml_capture_data import GPM_PCIE_TX_KBS
from tests.support.nvml_capture_fake import install


def test_a_card_with_gpm_reports_one_interval_and_the_call_latencies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, count=2)
    assert gpm_check.main(["--interval", "0.15", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "gpm.json").read_text())
    assert sorted(results) == ["0", "1"]
    card = results["0"]
    assert card["gpm_supported"] is True
    assert card["card"]["interval_seconds"] >= 0.15
    assert card["card"]["metrics"]["pcie_tx_bytes_per_second"] == pytest.approx(GPM_PCIE_TX_KBS * 1024)
    assert len(card["call_ms"]["nvmlGpmSampleGet"]) == 2, "two samples bracket the interval"
    assert len(card["call_ms"]["nvmlGpmMetricsGet"]) == 1
    assert len(card["call_ms"]["nvmlDeviceGetPcieThroughput"]) == 2, "the fallback's two 20 ms windows"
    assert card["pcie_sampling_window"]["tx_bytes_per_second"] == pytest.approx(GPM_PCIE_TX_KBS * 1024)
    assert "GPU 0: GPM supported" in capsys.readouterr().out


def test_a_card_without_gpm_is_reported_not_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch)
    fake.gpm.supported = False
    assert gpm_check.main(["--interval", "0.15", "--out", str(tmp_path)]) == 0
    card = json.loads((tmp_path / "gpm.json").read_text())["0"]
    assert card["gpm_supported"] is False and card["card"] is None
    assert "nvmlGpmSampleGet" not in card["call_ms"]


def test_a_failing_gpm_call_fails_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch)
    fake.fail("nvmlGpmMetricsGet", pynvml.NVML_ERROR_UNKNOWN)
    assert gpm_check.main(["--interval", "0.15", "--out", str(tmp_path)]) == 1
    assert "nvmlGpmMetricsGet" in json.loads((tmp_path / "gpm.json").read_text())["0"]["error"]


def test_every_metric_id_is_reported_supported_or_rejected(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The per-id probe: on the captured driver (CUDA 13.0) id 8 is not in the branch's nvml.h; a driver that
    refuses requests holding it shows that as 'rejected' and the whole request as REFUSED, while the request of the
    branch's own ids is answered. NVLink (no links on the captured card) is the card's per-metric 'not supported'."""
    fake = install(monkeypatch)
    fake.gpm.refused = {8}
    assert gpm_check.main(["--interval", "0.15", "--out", str(tmp_path)]) == 0
    probe = json.loads((tmp_path / "gpm.json").read_text())["0"]["metric_ids"]
    ids = probe["ids"]
    assert ids["8"]["status"].startswith("rejected") and ids["8"]["defined_in_branch"] is False
    assert ids["2"]["status"] == "supported" and ids["2"]["name"] == "sm_active"
    assert ids["60"]["status"].startswith("not supported"), "no NVLink on the captured card"
    assert ids["166"]["defined_in_branch"] is True  # NVENC 0: defined since 12.9; the H200 has no NVENC
    assert probe["requests"]["all known ids"].startswith("REFUSED")
    assert probe["requests"]["the ids this branch defines"].startswith("answered")
    out = capsys.readouterr().out
    assert "id   8 tensor_dmma_active" in out and "rejected" in out and "[not in this branch's nvml.h]" in out


def test_the_profiling_bench_runs_with_no_driver() -> None:
    """bench/profiling_bench.py stubs every pynvml call NvmlProfiling makes (the CUDA version one included): with no
    driver here, a call left unstubbed would fail as "NVML uninitialised" instead of being timed."""
    from bench import profiling_bench

    assert profiling_bench.nvml_python_cost(3) > 0
