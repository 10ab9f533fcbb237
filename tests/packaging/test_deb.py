"""The .deb: build it, install it into a throwaway root with dpkg (maintainer scripts run chrootless with DPKG_ROOT),
run the installed daemon in simulation and scrape it, verify the installed unit, then upgrade, remove, reinstall
and purge.

What this proves: the package's files, control data and maintainer scripts are right, the virtualenv works from
/opt/xpu-runtime-kit with nothing from the build tree, and the unit passes `systemd-analyze verify` against the
installed ExecStart. The daemon is started by the test, not by systemd (test_deb_nspawn.py boots systemd), and
dependencies are forced (the throwaway root has no python3 package recorded; the host's /usr provides it).

To run the installed files at their real paths, each command runs in a private mount namespace where the throwaway
root's /etc and /usr are overlaid on the host's and its /opt replaces the host's. Without that privilege the test
falls back to starting the packaged venv's python directly and says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.debhelpers import deb_under_test
from tests.support.servicehelpers import REPO, NotifySocket, running_daemon

pytestmark = pytest.mark.deb

PREFIX = "/opt/xpu-runtime-kit"
UNIT = "usr/lib/systemd/system/xpu-healthd.service"


def _missing_tools() -> str | None:
    for tool in ("dpkg-deb", "dpkg", "systemctl", "systemd-sysusers", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (./dev test installs it)"
    if not Path("/usr/bin/python3").exists():
        return "/usr/bin/python3 (Debian's Python) not installed"
    if os.geteuid() != 0:
        return "needs root for dpkg --root and a private mount namespace"
    return None


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (reason := _missing_tools()) is not None:
        pytest.skip(reason)
    return deb_under_test(tmp_path_factory)


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", "--force-not-root", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def empty_root(path: Path) -> Path:
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"):
        (path / d).mkdir(parents=True)
    (path / "var/lib/dpkg/status").touch()
    (path / "var/lib/dpkg/available").touch()
    return path


def namespace_prefix(root: Path) -> list[str] | None:
    """A command prefix that runs argv with the installed files at their real paths, or None without privilege."""
    mounts = (
        f"mount -t overlay overlay -o lowerdir={root}/etc:/etc /etc"
        f" && mount -t overlay overlay -o lowerdir={root}/usr:/usr /usr"
        f" && mount --bind {root}/opt /opt"
    )
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30, check=False)
    return prefix if probe.returncode == 0 else None


def run_installed(root: Path, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    prefix = namespace_prefix(root)
    if prefix is None:
        args = [f"{root}{a}" if a.startswith("/etc/xpu-runtime-kit/") else a for a in argv[1:]]
        argv = [str(root / PREFIX.lstrip("/") / "bin/python"), "-m", "healthd", *args]
        print("no private mount namespace: running the packaged venv's python from the throwaway root")
        prefix = []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120, check=False)


def test_deb_installs_runs_upgrades_removes_and_purges(deb: Path, tmp_path: Path) -> None:
    root = empty_root(tmp_path / "root")
    install = dpkg(root, "-i", str(deb))
    assert "Setting up xpu-runtime-kit" in install.stdout

    # files, conffile, group, enabled unit, state directory
    assert (root / "etc/xpu-runtime-kit/healthd.toml").read_text() == (REPO / "packaging/healthd.toml").read_text()
    for unit in ("xpu-healthd.service", "xpu-nvidia-modprobe.service"):
        assert (root / "usr/lib/systemd/system" / unit).read_text() == (REPO / "packaging/systemd" / unit).read_text()
    nodes = root / "opt/xpu-runtime-kit/libexec/xpu-nvidia-device-nodes"  # what xpu-nvidia-modprobe.service runs
    assert nodes.read_text() == (REPO / "packaging/libexec/xpu-nvidia-device-nodes").read_text()
    assert nodes.stat().st_mode & 0o777 == 0o755
    assert any(line.startswith("xpu:") for line in (root / "etc/group").read_text().splitlines())
    wants = root / "etc/systemd/system/multi-user.target.wants/xpu-healthd.service"
    assert os.readlink(wants) == "/" + UNIT
    assert oct((root / "var/lib/xpu-runtime-kit").stat().st_mode & 0o777) == "0o750"
    status = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Status} ${Conffiles}", "xpu-runtime-kit"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert status.startswith("install ok installed")
    assert "/etc/xpu-runtime-kit/healthd.toml" in status
    # dashboards, alert rules and the Alertmanager example for the monitoring side, as in the repository
    share = root / "usr/share/xpu-runtime-kit"
    shipped = {
        **{f"dashboards/{p.name}": p for p in (REPO / "dashboards").glob("*.json")},
        "dashboards/provisioning/xpu-runtime-kit.yml": REPO / "dashboards/provisioning/xpu-runtime-kit.yml",
        "alerts/xpu-healthd.rules.yml": REPO / "alerts/xpu-healthd.rules.yml",
        "alerts/alertmanager.example.yml": REPO / "alerts/alertmanager.example.yml",
    }
    assert len(shipped) >= 8
    for relative, source in shipped.items():
        assert (share / relative).read_bytes() == source.read_bytes(), relative
    assert sorted(p.name for p in (share / "dashboards").glob("*.json")) == sorted(
        p.name for p in (REPO / "dashboards").glob("*.json")
    )
    # nothing in the venv points back at the build machine's staging directory
    for script in ("xpu-healthd", "xpuctl"):
        assert (root / PREFIX.lstrip("/") / "bin" / script).read_text().splitlines()[0] == f"#!{PREFIX}/bin/python"

    # the installed entry points, as the unit runs them
    version = run_installed(root, ["/usr/bin/xpu-healthd", "--version"])
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "xpu-healthd 0.1.0"
    check = run_installed(
        root, ["/usr/bin/xpu-healthd", "--check-config", "--config", "/etc/xpu-runtime-kit/healthd.toml"]
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("configuration OK (")
    assert check.stdout.strip().endswith("/etc/xpu-runtime-kit/healthd.toml)")

    if namespace_prefix(root) is not None:
        verify = run_installed(root, ["systemd-analyze", "verify", "--man=no", "/" + UNIT])
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert verify.stderr.strip() == ""

    scrape_installed_daemon(root, tmp_path)

    # upgrade (same version again): state and a locally edited conffile survive
    (root / "var/lib/xpu-runtime-kit/faults.db").write_text("state")
    conf = root / "etc/xpu-runtime-kit/healthd.toml"
    conf.write_text(conf.read_text() + "\n# local edit\n")
    dpkg(root, "--force-confold", "-i", str(deb))
    assert conf.read_text().endswith("# local edit\n")
    assert (root / "var/lib/xpu-runtime-kit/faults.db").exists()

    # remove: program and unit gone, state and config kept; the enablement is remembered (as Debian does with
    # deb-systemd-helper), so a reinstall enables and starts it again
    dpkg(root, "-r", "xpu-runtime-kit")
    assert not (root / PREFIX.lstrip("/")).exists()
    assert not (root / UNIT).exists()
    assert wants.is_symlink() and not (root / os.readlink(wants).lstrip("/")).exists()  # dangling until reinstalled
    assert (root / "var/lib/xpu-runtime-kit/faults.db").read_text() == "state"
    assert conf.exists()
    dpkg(root, "-i", str(deb))
    assert (root / os.readlink(wants).lstrip("/")).is_file()
    assert (root / "var/lib/xpu-runtime-kit/faults.db").read_text() == "state"

    # purge: state, config and the enablement gone; the group stays (files elsewhere may belong to it)
    dpkg(root, "-P", "xpu-runtime-kit")
    assert not (root / "var/lib/xpu-runtime-kit").exists()
    assert not (root / "etc/xpu-runtime-kit").exists()
    assert not wants.is_symlink()
    assert not list((root / "var/lib/systemd/deb-systemd-helper-enabled").rglob("xpu-healthd*"))
    assert any(line.startswith("xpu:") for line in (root / "etc/group").read_text().splitlines())


def scrape_installed_daemon(root: Path, tmp_path: Path) -> None:
    """Start the installed daemon in simulation, wait for READY, scrape /metrics, stop it with SIGTERM."""
    notify = NotifySocket(tmp_path / "notify.sock")
    prefix = namespace_prefix(root)
    daemon_argv = [
        "--config",
        "/etc/xpu-runtime-kit/healthd.toml" if prefix else str(root / "etc/xpu-runtime-kit/healthd.toml"),
        "--simulate",
        "h200x1",
        "--metrics-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        f"unix:{tmp_path}/healthd.sock",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    python = (
        [*prefix, "/usr/bin/xpu-healthd"]
        if prefix
        else [str(root / PREFIX.lstrip("/") / "bin/python"), "-m", "healthd"]
    )
    env = {"NOTIFY_SOCKET": str(notify.path), "PYTHONPATH": "", "PYTHONSAFEPATH": "1"}
    try:
        with running_daemon(daemon_argv, env, python=python) as daemon:
            notify.wait_for("READY")
            started = daemon.wait_event("starting")
            assert started["version"] == "0.1.0"  # the installed distribution, not this source tree
            port = daemon.metrics_port()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                body = reply.read().decode()
            assert "xpu_gpu_info{" in body
            assert "H200" in body
            daemon.signal(signal.SIGTERM)
            assert notify.wait_for("STOPPING")["STOPPING"] == "1"
            assert daemon.proc.wait(30) == 0
    finally:
        notify.close()
