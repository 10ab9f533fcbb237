"""The shipped units: `systemd-analyze verify` passes against an installed ExecStart, and the security exposure
stays at the hardened level (it was 9.6 "UNSAFE" for the bare Type=notify unit; see docs/operations.md).
The device list is checked in test_unit_devices.py; the units under a real systemd in test_deb_nspawn.py."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.servicehelpers import REPO

UNIT = REPO / "packaging" / "systemd" / "xpu-healthd.service"
MODPROBE_UNIT = REPO / "packaging" / "systemd" / "xpu-nvidia-modprobe.service"
EXPOSURE_LIMIT = 3.0


def analyze(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (./dev test installs systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def service_section(unit: Path = UNIT) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_declares_notify_watchdog_restart_and_directories() -> None:
    s = service_section()
    assert s["Type"] == ["notify"]
    assert s["WatchdogSec"] == ["30s"]
    assert s["Restart"] == ["on-failure"]
    assert (s["StartLimitBurst"], s["StartLimitIntervalSec"]) == (["10"], ["10min"])
    assert s["RuntimeDirectory"] == s["StateDirectory"] == ["xpu-runtime-kit"]
    # the MPS daemons outlive restarts and stops of the daemon, so their pipe directories must too
    assert s["RuntimeDirectoryPreserve"] == ["yes"]
    # the daemon never writes its configuration: ConfigurationDirectory= would make /etc/xpu-runtime-kit writable
    assert "ConfigurationDirectory" not in s
    # a shell builtin: /bin/kill is procps, not always installed
    assert s["ExecReload"] == ["/bin/sh -c 'kill -HUP $MAINPID'"]
    assert "+/usr/bin/install -d -m 0755 /run/cdi" in s["ExecStartPre"]
    assert s["ReadOnlyPaths"] == ["/run"]
    assert "XPU_MPS_LAUNCH=systemd-run" in s["Environment"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["PrivateTmp"] == ["yes"]
    assert set(s["CapabilityBoundingSet"][0].split()) == {"CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SYSLOG"}
    # the NVIDIA modules are loaded by a unit that finishes first (DeviceAllow= resolves when the unit starts)
    assert "xpu-nvidia-modprobe.service" in s["Wants"][0].split()
    assert "xpu-nvidia-modprobe.service" in s["After"][0].split()
    # configparser reads it too (no duplicate sections, no stray syntax)
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]


def test_modprobe_unit_is_optional_and_never_blocks_the_daemon() -> None:
    m = service_section(MODPROBE_UNIT)
    assert m["Type"] == ["oneshot"]
    assert m["RemainAfterExit"] == ["yes"]
    # "-": a failure does not stop xpu-healthd; the script is tested in test_nvidia_device_nodes.py
    assert m["ExecStart"] == ["-/opt/xpu-runtime-kit/libexec/xpu-nvidia-device-nodes"]
    assert m["ConditionFileIsExecutable"] == ["/usr/bin/nvidia-modprobe"]
    assert m["Before"] == ["xpu-healthd.service"]
    assert "WantedBy" not in m  # pulled in by xpu-healthd.service, never enabled on its own


def test_security_exposure_stays_hardened(tmp_path: Path) -> None:
    shutil.copy(UNIT, tmp_path / UNIT.name)
    result = analyze("security", "--offline=yes", UNIT.name, cwd=tmp_path)
    match = re.search(r"Overall exposure level for xpu-healthd.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= EXPOSURE_LIMIT, result.stdout


def installed_root(tmp_path: Path) -> Path:
    """A root with the default targets, both units, a stand-in ExecStart and the tools the units name."""
    root = tmp_path / "root"
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for target in Path("/usr/lib/systemd/system").glob("*.target"):  # the default dependencies
        shutil.copy(target, units)
    shutil.copy(UNIT, units)
    shutil.copy(MODPROBE_UNIT, units)
    exe = root / "opt/xpu-runtime-kit/bin/xpu-healthd"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    for tool in ("/bin/sh", "/usr/bin/install"):
        (root / tool.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tool, root / tool.lstrip("/"))
    return root


def test_verify_passes_with_the_installed_executable(tmp_path: Path) -> None:
    root = installed_root(tmp_path)
    units = root / "usr/lib/systemd/system"
    for name in (UNIT.name, MODPROBE_UNIT.name):
        result = analyze("verify", f"--root={root}", "--man=no", str(units / name))
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stderr.strip() == ""
    # and it does catch a broken unit
    (units / UNIT.name).write_text(UNIT.read_text().replace("Type=notify", "Type=notifyy"))
    broken = analyze("verify", f"--root={root}", "--man=no", str(units / UNIT.name))
    assert "notifyy" in broken.stderr
