"""bench/xid_registration.py without a GPU: over the capture fake, the evidence it prints and writes for each card."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from bench import xid_registration
from tests.support.nvml_capture_fake import install

CAPTURED_SUPPORTED = 65439  # nvmlDeviceGetSupportedEventTypes of the captured H200 (0xff9f)


def test_evidence_per_card(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = install(monkeypatch, count=2)
    assert xid_registration.main(["--out", str(tmp_path), "--wait-ms", "50"]) == 0
    result = json.loads((tmp_path / "xid_registration.json").read_text())
    assert (result["driver_version"], result["driver_branch"]) == ("580.159.04", 580)
    assert [c["index"] for c in result["cards"]] == [0, 1]
    card = result["cards"][0]
    assert card["supported"]["mask"] == hex(CAPTURED_SUPPORTED)
    assert {"XidCriticalError", "DoubleBitEccError", "SingleBitEccError"} <= set(card["supported"]["types"])
    assert "PowerSourceChange" in card["supported"]["types"]  # bit 0x80 is set in the capture ...
    assert "PState" in card["supported"]["types"]
    assert set(card["one_by_one"]) == set(card["supported"]["types"])  # ... and each supported bit was tried
    assert all(r["registered"] for r in card["one_by_one"].values())
    assert card["daemon_mask"]["registered"] and card["daemon_mask"]["mask"] == "0xb"
    assert card["daemon_mask"]["wait"] == "Timeout"  # the capture's quiet card
    assert card["registered_again"]["registered"]
    assert card["recovery_action"] == {"raw": 0, "decoded": "none"}
    assert card["parent_processes"] == {"count": 0}
    assert fake.live_sets == 0  # every set it made was freed
    printed = capsys.readouterr().out
    assert "driver 580.159.04 (branch 580)" in printed and "daemon mask 0xb" in printed


def test_refusals_are_evidence_not_failures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, mig=True, privileged=False)
    fake.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert xid_registration.main(["--out", str(tmp_path)]) == 0
    card = json.loads((tmp_path / "xid_registration.json").read_text())["cards"][0]
    assert not card["daemon_mask"]["registered"] and card["daemon_mask"]["error"] == "NotSupported"
    assert {r["error"] for r in card["one_by_one"].values()} == {"NotSupported"}
    assert card["mig_mode"] == "on" and card["parent_processes"] == {"error": "NoPermission"}
    assert fake.live_sets == 0


def test_no_driver_is_exit_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = install(monkeypatch)
    fake.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert xid_registration.main([]) == 1
    assert "cannot be initialised" in capsys.readouterr().out
