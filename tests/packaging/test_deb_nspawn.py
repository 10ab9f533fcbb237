"""The built .deb on a minimal Debian booted with systemd as PID 1 (systemd-nspawn), as on a real node.

One boot walks through a node's life: install (enabled, started after xpu-nvidia-modprobe, which made a device node
for each of 8 cards), READY and STATUS, watchdog pings, the effective capabilities, the sandbox's writable paths,
reload (no procps in the tree), restart, a TDM partition whose MPS control daemon runs as a transient unit outside
the sandbox and survives daemon restarts, a uid-1000 client of a TDM partition reaching its MPS server, the watchdog
killing a stuck daemon, `kill -9` recovery, the start limit, stop, remove, reinstall after remove, purge and reinstall
after purge. A second test installs into the tree without booting it (an image build: no systemd running).

Stand-ins, and what they leave unproven:
- nvidia-modprobe records its arguments and makes /dev/nvidiaN with mknod; /proc/driver is a tmpfs holding an 8-card
  /proc/driver/nvidia/gpus (tests/support/nvidia_gpus.py, the kernel module's format). Not proven: that the real
  nvidia-modprobe and the real procfs behave alike, or that NVML then opens the cards (no GPU here).
- nvidia-cuda-mps-control is tests/fakes/nvidia-cuda-mps-control, whose daemon starts a server process as the
  client's uid that opens <pipe>/log and connects to <pipe>/control. Not proven: what else the real server touches.

The tree is debootstrapped once and cached (tests/support/nspawn.py). Without root, or where the kernel forbids
namespaces, the tests skip with the reason; with XPU_DEB set (CI) missing tools are a failure, elsewhere a skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.support.nspawn as nspawn
from tests.support.debhelpers import deb_under_test
from tests.support.nvidia_gpus import CARDS, write_gpus
from tests.support.servicehelpers import REPO

pytestmark = [pytest.mark.deb, pytest.mark.timeout(1800)]

UNIT = "xpu-healthd.service"
FAKE_MPS = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"
# records its arguments, and makes /dev/nvidiaN for -c=N as the real one does (major 195, the driver's)
FAKE_MODPROBE = """#!/bin/sh
echo "$@" >> /run/fake-modprobe.log
for arg in "$@"; do
    case $arg in -c=*) n=${arg#-c=}; [ -e /dev/nvidia$n ] || mknod -m 0666 /dev/nvidia$n c 195 $n ;; esac
done
"""
CLIENT_UID = 1000
CAP_NAMES = {"CAP_CHOWN": 0, "CAP_SYS_ADMIN": 21, "CAP_SYSLOG": 34}


def _precondition() -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-nspawn needs root")
    if missing := nspawn.missing_tools():
        message = f"not installed: {', '.join(missing)} (./dev test installs debootstrap and systemd-container)"
        if os.environ.get("XPU_DEB"):
            pytest.fail(message)
        pytest.skip(message)
    if (reason := nspawn.namespaces_forbidden()) is not None:
        print(f"skipping the nspawn boot: the kernel forbids namespaces: {reason}")
        pytest.skip(f"the kernel forbids namespaces: {reason}")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _precondition()
    out = tmp_path_factory.mktemp("nspawn-assets")
    (out / "xpu.deb").symlink_to(deb_under_test(tmp_path_factory))
    (out / "nvidia-cuda-mps-control").write_bytes(FAKE_MPS.read_bytes())
    (out / "nvidia-modprobe").write_text(FAKE_MODPROBE)
    write_gpus(out / "driver" / "nvidia" / "gpus")
    return out


@pytest.fixture(scope="module")
def tree(assets: Path) -> Path:
    return nspawn.cached_tree()


def binds(assets: Path) -> list[tuple[Path, str]]:
    return [((assets / "xpu.deb").resolve(), "/xpu-test/xpu.deb"), (assets, "/xpu-test/assets")]


@pytest.fixture
def node(tree: Path, assets: Path, tmp_path: Path) -> Iterator[nspawn.Booted]:
    """The container, booted while the host holds the daemon's port, as it does while ``./dev run`` is up: the
    installed daemon must bind :9410 in a network of its own."""
    with host_holds_port(9410), nspawn.booted(tree, binds(assets), tmp_path / "console.log") as container:
        yield container


@contextlib.contextmanager
def host_holds_port(port: int) -> Iterator[None]:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("0.0.0.0", port))
        holder.listen(1)
    except OSError:  # already held (a daemon of the developer's own, say): the same situation
        pass
    try:
        yield
    finally:
        holder.close()


def show(c: nspawn.Booted, prop: str, unit: str = UNIT) -> str:
    return c.out(f"systemctl show -P {prop} {unit}")


def main_pid(c: nspawn.Booted) -> int:
    return int(show(c, "MainPID"))


def wait_active_with_new_pid(c: nspawn.Booted, old: int, timeout: float = 60) -> int:
    c.wait_for(
        f'test "$(systemctl is-active {UNIT})" = active && test "$(systemctl show -P MainPID {UNIT})" != {old}'
        f' && test "$(systemctl show -P MainPID {UNIT})" != 0',
        timeout=timeout,
        what=f"{UNIT} active again under a new PID",
    )
    return main_pid(c)


def test_image_install_enables_without_a_running_systemd(tree: Path, assets: Path) -> None:
    out = nspawn.run_in_image(
        tree,
        binds(assets),
        "test ! -d /run/systemd/system; dpkg -i /xpu-test/xpu.deb; systemctl is-enabled xpu-healthd.service;"
        " readlink /etc/systemd/system/multi-user.target.wants/xpu-healthd.service",
    )
    assert "Setting up xpu-runtime-kit" in out
    assert out.splitlines()[-2:] == ["enabled", "/lib/systemd/system/xpu-healthd.service"]
    assert "did not" not in out  # nothing tried to start it


def test_node_lifecycle(node: nspawn.Booted) -> None:
    c = node
    # the tree is minimal on purpose: no procps, so /bin/kill does not exist
    c.sh("test ! -e /bin/kill && test ! -e /usr/bin/kill")
    c.sh("install -m 0755 /xpu-test/assets/nvidia-modprobe /usr/bin/nvidia-modprobe")
    c.sh("install -m 0755 /xpu-test/assets/nvidia-cuda-mps-control /usr/local/bin/nvidia-cuda-mps-control")
    # an 8-card /proc/driver/nvidia/gpus: /proc/driver of the container's procfs, covered by a tmpfs that holds it
    c.sh("mount -t tmpfs -o mode=0555 xpu-fake-driver /proc/driver")
    c.sh("cp -r /xpu-test/assets/driver/nvidia /proc/driver/")
    for step in (
        install_enables_and_starts,
        ready_status_and_watchdog,
        capabilities_are_the_units_set,
        sandbox_writes_only_where_it_should,
        reload_without_procps,
        mps_runs_outside_the_sandbox_and_survives_restarts,
        a_non_root_client_reaches_its_mps_server,
        watchdog_restarts_a_stuck_daemon,
        kill_9_is_recovered,
        start_limit_counts_every_start,
        stop_remove_reinstall_purge,
    ):
        started = time.monotonic()
        step(c)
        print(f"nspawn: {step.__name__}: ok ({time.monotonic() - started:.1f}s)")


def install_enables_and_starts(c: nspawn.Booted) -> None:
    out = c.out("dpkg -i /xpu-test/xpu.deb 2>&1")
    assert "Setting up xpu-runtime-kit" in out, out
    assert c.out(f"systemctl is-enabled {UNIT}") == "enabled"
    assert c.out(f"systemctl is-active {UNIT}") == "active"
    # xpu-nvidia-modprobe ran nvidia-modprobe for every card listed, and finished before the daemon's unit began
    calls = c.out("cat /run/fake-modprobe.log").splitlines()
    assert calls[0] == "-u -c=0"
    assert sorted(calls[1:]) == sorted(f"-c={minor}" for minor in CARDS.values() if minor != 0)
    modprobe_done = int(show(c, "ActiveEnterTimestampMonotonic", "xpu-nvidia-modprobe.service"))
    assert 0 < modprobe_done <= int(show(c, "InactiveExitTimestampMonotonic"))
    # so the daemon, inside its sandbox, finds a node for every card (it could not have made one)
    seen = c.out(f"nsenter --target {main_pid(c)} --mount ls /dev").split()
    assert {n for n in seen if re.fullmatch(r"nvidia\d+", n)} == {f"nvidia{minor}" for minor in CARDS.values()}


def ready_status_and_watchdog(c: nspawn.Booted) -> None:
    assert show(c, "Type") == "notify"
    assert show(c, "SubState") == "running"  # READY=1 arrived (Type=notify stays "start" until then)
    assert show(c, "StatusText"), "no STATUS= from the daemon"
    assert show(c, "WatchdogUSec") == "30s"
    first = int(show(c, "WatchdogTimestampMonotonic"))
    c.wait_for(f"test $(systemctl show -P WatchdogTimestampMonotonic {UNIT}) -gt {first}", timeout=15, what="a ping")


def capabilities_are_the_units_set(c: nspawn.Booted) -> None:
    """CapEff is the unit's set, less what the container's own bounding set lacks (nspawn drops CAP_SYSLOG)."""
    pid = main_pid(c)
    status = dict(line.split(":\t", 1) for line in c.out(f"cat /proc/{pid}/status").splitlines() if ":\t" in line)
    bounding = int(c.out("grep CapBnd /proc/1/status | cut -f2"), 16)
    wanted = sum(1 << bit for bit in CAP_NAMES.values()) & bounding
    assert int(status["CapEff"], 16) == wanted, f"CapEff {status['CapEff']}, wanted {wanted:#x}"
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"


def sandbox_writes_only_where_it_should(c: nspawn.Booted) -> None:
    pid = main_pid(c)
    probe = "nsenter --target {pid} --mount sh -c 'touch {path}/.xpu-probe && rm {path}/.xpu-probe'"
    for path in ("/run/cdi", "/run/xpu-runtime-kit", "/var/lib/xpu-runtime-kit"):
        c.sh(probe.format(pid=pid, path=path))
    for path in ("/run", "/run/systemd", "/etc/xpu-runtime-kit", "/etc", "/opt/xpu-runtime-kit", "/usr"):
        denied = c.sh(probe.format(pid=pid, path=path), check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (path, denied.stderr)
    assert c.out("stat -c %a /run/cdi") == "755"


def reload_without_procps(c: nspawn.Booted) -> None:
    pid = main_pid(c)
    c.sh(f"systemctl reload {UNIT}")
    assert main_pid(c) == pid
    c.wait_for(f"journalctl -u {UNIT} -o cat | grep -q 'configuration reloaded'", timeout=20, what="reload logged")


def mps_runs_outside_the_sandbox_and_survives_restarts(c: nspawn.Booted) -> None:
    c.sh(
        'sed -i -e \'s/^# simulate = ""/simulate = "h200x1"/\' -e \'s/^# mps_control = "auto"/mps_control = "nvidia"/\''
        " /etc/xpu-runtime-kit/healthd.toml"
    )
    old = main_pid(c)
    c.sh(f"systemctl restart {UNIT}")
    wait_active_with_new_pid(c, old)
    c.sh("xpuctl partitions mode 0 tdm")
    created = c.out("xpuctl partitions create --gpu 0 --compute 30 --memory 2GiB --json")
    (pid_match,) = re.findall(r'"id": "(p-[0-9a-f]+)"', created)
    mps = f"xpu-mps-{pid_match}.service"
    assert c.out(f"systemctl is-active {mps}") == "active"
    assert show(c, "ControlGroup", mps).endswith(f"/xpu-mps.slice/{mps}")
    assert show(c, "MemoryDenyWriteExecute", mps) == "no"
    mps_pid = int(show(c, "MainPID", mps))
    assert f"{UNIT}" not in c.out(f"cat /proc/{mps_pid}/cgroup")
    assert c.out(f"grep CapEff /proc/{mps_pid}/status | cut -f2") == c.out("grep CapBnd /proc/1/status | cut -f2")
    # a restart of xpu-healthd leaves the MPS daemon (and its clients) alone; the partition is adopted
    daemon = main_pid(c)
    c.sh(f"systemctl restart {UNIT}")
    wait_active_with_new_pid(c, daemon)
    assert int(show(c, "MainPID", mps)) == mps_pid
    assert pid_match in c.out("xpuctl partitions list")
    c.sh(f"xpuctl partitions delete {pid_match}")
    c.wait_for(f"! systemctl is-active --quiet {mps}", timeout=30, what=f"{mps} gone after delete")


def a_non_root_client_reaches_its_mps_server(c: nspawn.Booted) -> None:
    """The unit's UMask=0027 made the partition directories 0750: an MPS server started as the client's uid could
    not reach <pipe>/control. A uid-1000 client of a TDM partition asks the installed unit's control daemon (the
    stand-in) for a server, and that server, running as uid 1000, reaches the daemon's endpoints."""
    created = c.out("xpuctl partitions create --gpu 0 --compute 20 --memory 1GiB --json")
    (partition,) = re.findall(r'"id": "(p-[0-9a-f]+)"', created)
    (pipe,) = re.findall(r'"CUDA_MPS_PIPE_DIRECTORY": "([^"]+)"', created)
    base = pipe.removesuffix("/pipe")
    as_client = f"setpriv --reuid={CLIENT_UID} --regid={CLIENT_UID} --clear-groups"
    answer = c.sh(
        f"CUDA_MPS_PIPE_DIRECTORY={pipe} {as_client} /usr/local/bin/nvidia-cuda-mps-control --cuda-client", check=False
    )
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert answer.stdout.strip() == f"server ready: uid {CLIENT_UID}"
    assert f"NEW CLIENT from user {CLIENT_UID}" in c.out(f"cat {base}/log/control.log")
    assert f"Startup as uid {CLIENT_UID}" in c.out(f"cat {base}/log/server.log")
    # the directories, made by the sandboxed daemon under UMask=0027: searchable by all, writable by root alone
    modes = c.out(f"stat -c '%a %U %n' /run/xpu-runtime-kit/mps {base} {pipe} {base}/log").splitlines()
    assert [line.split()[:2] for line in modes] == [["755", "root"]] * 4, modes
    for where in (pipe, f"{base}/log", base):
        assert c.sh(f"{as_client} touch {where}/x", check=False).returncode != 0, f"{where} writable by the client"
    c.sh(f"xpuctl partitions delete {partition}")
    c.wait_for(f"test ! -e {base}", timeout=30, what="the partition's directories removed after delete")


def watchdog_restarts_a_stuck_daemon(c: nspawn.Booted) -> None:
    c.sh(
        f"mkdir -p /run/systemd/system/{UNIT}.d && printf '[Service]\\nWatchdogSec=4s\\nTimeoutAbortSec=2s\\n'"
        f" > /run/systemd/system/{UNIT}.d/watchdog-test.conf && systemctl daemon-reload"
    )
    old = main_pid(c)
    c.sh(f"systemctl restart {UNIT}")
    stuck = wait_active_with_new_pid(c, old)
    restarts = int(show(c, "NRestarts"))
    c.sh(f"kill -STOP {stuck}")  # a daemon that stops moving stops pinging; SIGABRT waits, then SIGKILL
    wait_active_with_new_pid(c, stuck, timeout=60)
    assert int(show(c, "NRestarts")) == restarts + 1
    c.sh(f"journalctl -u {UNIT} -o cat | grep -q 'Watchdog timeout'")
    c.sh(f"rm -r /run/systemd/system/{UNIT}.d && systemctl daemon-reload")


def kill_9_is_recovered(c: nspawn.Booted) -> None:
    old = main_pid(c)
    restarts = int(show(c, "NRestarts"))
    c.sh(f"kill -9 {old}")
    wait_active_with_new_pid(c, old)
    assert int(show(c, "NRestarts")) == restarts + 1


def start_limit_counts_every_start(c: nspawn.Booted) -> None:
    """As documented: manual starts count toward StartLimitBurst too; one more is refused until reset-failed.

    The unit's own burst (10) is checked in test_systemd_unit.py; a drop-in lowers it to 3 to keep this step short.
    """
    dropin = f"/run/systemd/system/{UNIT}.d"
    c.sh(f"mkdir -p {dropin} && printf '[Unit]\\nStartLimitBurst=3\\n' > {dropin}/limit.conf")
    c.sh("systemctl daemon-reload")
    c.sh(f"systemctl reset-failed {UNIT}")
    for _ in range(3):
        c.sh(f"systemctl restart {UNIT}", timeout=150)
    refused = c.sh(f"systemctl restart {UNIT}", check=False)
    assert refused.returncode != 0
    assert show(c, "Result") == "start-limit-hit"
    c.sh(f"rm -r {dropin} && systemctl daemon-reload && systemctl reset-failed {UNIT} && systemctl start {UNIT}")
    assert c.out(f"systemctl is-active {UNIT}") == "active"


def stop_remove_reinstall_purge(c: nspawn.Booted) -> None:
    c.sh(f"systemctl stop {UNIT}")
    assert show(c, "ActiveState") == "inactive"
    assert show(c, "Result") == "success"
    c.sh(f"systemctl start {UNIT}")

    c.sh("dpkg -r xpu-runtime-kit")
    assert c.sh(f"systemctl is-active --quiet {UNIT}", check=False).returncode != 0
    c.sh("test ! -e /lib/systemd/system/xpu-healthd.service && test ! -e /opt/xpu-runtime-kit")
    c.sh("test -d /var/lib/xpu-runtime-kit && test -f /etc/xpu-runtime-kit/healthd.toml")  # kept on remove

    c.sh("dpkg -i /xpu-test/xpu.deb")  # reinstall after remove: enabled and running again
    assert c.out(f"systemctl is-enabled {UNIT}") == "enabled"
    assert c.out(f"systemctl is-active {UNIT}") == "active"

    c.sh("dpkg -P xpu-runtime-kit")
    assert c.sh(f"systemctl is-active --quiet {UNIT}", check=False).returncode != 0
    c.sh("test ! -e /var/lib/xpu-runtime-kit && test ! -e /etc/xpu-runtime-kit && test ! -e /run/xpu-runtime-kit")
    c.sh("test ! -L /etc/systemd/system/multi-user.target.wants/xpu-healthd.service")

    c.sh("dpkg -i /xpu-test/xpu.deb")  # and after purge, a fresh install
    assert c.out(f"systemctl is-enabled {UNIT}") == "enabled"
    assert c.out(f"systemctl is-active {UNIT}") == "active"
