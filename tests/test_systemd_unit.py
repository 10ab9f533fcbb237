"""The shipped unit: `systemd-analyze verify` passes against an installed ExecStart, and the security exposure
stays at the hardened level (it was 9.6 "UNSAFE" for the bare Type=notify unit; see docs/operations.md)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from servicehelpers import REPO

UNIT = REPO / "packaging" / "systemd" / "xpu-healthd.service"
EXPOSURE_LIMIT = 3.0


def analyze(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (./dev test installs systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def service_section() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_declares_notify_watchdog_restart_and_directories() -> None:
    s = service_section()
    assert s["Type"] == ["notify"]
    assert s["WatchdogSec"] == ["30s"]
    assert s["Restart"] == ["on-failure"]
    assert s["StartLimitBurst"] == ["5"]
    assert s["RuntimeDirectory"] == s["StateDirectory"] == s["ConfigurationDirectory"] == ["xpu-runtime-kit"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["PrivateTmp"] == ["yes"]
    assert set(s["CapabilityBoundingSet"][0].split()) == {"CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SYSLOG"}
    # configparser reads it too (no duplicate sections, no stray syntax)
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]


def test_security_exposure_stays_hardened(tmp_path: Path) -> None:
    shutil.copy(UNIT, tmp_path / UNIT.name)
    result = analyze("security", "--offline=yes", UNIT.name, cwd=tmp_path)
    match = re.search(r"Overall exposure level for xpu-healthd.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= EXPOSURE_LIMIT, result.stdout


def test_verify_passes_with_the_installed_executable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for target in Path("/usr/lib/systemd/system").glob("*.target"):  # the default dependencies
        shutil.copy(target, units)
    shutil.copy(UNIT, units)
    exe = root / "opt/xpu-runtime-kit/bin/xpu-healthd"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (root / "bin").mkdir()
    for tool in ("kill", "mkdir"):
        shutil.copy(f"/bin/{tool}", root / "bin" / tool)
    result = analyze("verify", f"--root={root}", "--man=no", str(units / UNIT.name))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == ""
    # and it does catch a broken unit
    (units / UNIT.name).write_text(UNIT.read_text().replace("Type=notify", "Type=notifyy"))
    broken = analyze("verify", f"--root={root}", "--man=no", str(units / UNIT.name))
    assert "notifyy" in broken.stderr
