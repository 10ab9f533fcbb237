"""The pieces of a device-plugin end-to-end test: a simulated xpu-healthd process, the plugin as a process, and the
kubelet double they both talk to (registration and pod-resources)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.daemon_process import DaemonProcess
from tests.support.kubelet_double import KubeletDouble
from tests.support.paths import REPO
from tests.support.servicehelpers import terminate

GPU = "xpu-runtime-kit.io/gpu"


def scenario_without_mig(directory: Path) -> Path:
    """The 8-card H200 scenario with MIG off on every card (the built-in one has it on for cards 6 and 7)."""
    text = (REPO / "exporter" / "scenarios" / "h200x8.toml").read_text()
    path = directory / "h200x8-nomig.toml"
    text = text.replace("mig_enabled = true", "mig_enabled = false")
    text = re.sub(r"\[\[mig_instances\]\]\n(?:[a-z_]+ = \d+\n)+", "", text)  # no MIG: no instances either
    path.write_text(text)
    return path


def daemon_config(pod_resources: Path) -> str:
    return (
        "[host]\n"
        "simulate_kubelet = false\n"
        f'kubelet_socket = "{pod_resources}"\n'
        "[attribution]\n"
        "refresh_interval_seconds = 0.5\n"
        "[partitions]\n"
        "reconcile_interval_seconds = 0.5\n"
        "owner_grace_seconds = 0\n"
    )


class PluginProcess:
    def __init__(self, daemon: DaemonProcess, kubelet_dir: Path, config: str, log: Path) -> None:
        self.config_file = log.parent / "plugin.toml"
        self.config_file.write_text(config)
        self.args = [
            sys.executable,
            "-m",
            "container.deviceplugin",
            "--healthd-socket",
            daemon.address,
            "--kubelet-dir",
            str(kubelet_dir),
            "--config",
            str(self.config_file),
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PluginProcess:
        self._out = self.log.open("ab")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return self

    def stop(self) -> int:
        assert self.proc is not None
        terminate(self.proc)
        self._out.close()
        return self.proc.returncode

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


@contextmanager
def stack(
    tmp: Path,
    *,
    scenario: str,
    plugin_config: str = "",
    daemon_extra: str = "",
    kubelet_clock: Callable[[], float] = time.monotonic,
    start_daemon: bool = True,
    hung_at_start: tuple[int, str] | None = None,
) -> Iterator[tuple[DaemonProcess, KubeletDouble, PluginProcess]]:
    """``hung_at_start``: (GPU, call) hung in the simulated backend from before the daemon starts (see
    tests/support/hung_at_start.py); ``xpuctl simulate clear`` releases it."""
    # unix socket paths are short: the kubelet directory lives in /tmp, not in pytest's deep tmp
    short = Path(tempfile.mkdtemp(prefix="xdp-", dir="/tmp"))
    kubelet = KubeletDouble(
        short / "device-plugins", short / "pod-resources" / "kubelet.sock", clock=kubelet_clock
    ).start()
    module: tuple[str, ...] = ("healthd",)
    if hung_at_start is not None:
        module = ("tests.support.hung_at_start", str(hung_at_start[0]), hung_at_start[1])
    daemon = DaemonProcess(
        tmp,
        scenario=scenario,
        extra_config=daemon_config(kubelet.pod_resources_socket) + daemon_extra,
        env={"PYTHONPATH": str(REPO)} if hung_at_start is not None else None,
        module=module,
    )
    plugin: PluginProcess | None = None
    try:
        if start_daemon:
            daemon.start()
        plugin = PluginProcess(
            daemon,
            kubelet.dir,
            "[partitions]\nrefresh_seconds = 0.5\nlease_seconds = 10\n" + plugin_config,
            tmp / "plugin.log",
        ).start()
        yield daemon, kubelet, plugin
    finally:
        if plugin is not None and plugin.proc is not None:
            plugin.stop()
        if daemon.proc is not None:
            if daemon.proc.poll() is None:
                os.kill(daemon.proc.pid, signal.SIGCONT)  # a test may have frozen it
            daemon.stop()
        kubelet.stop()
        shutil.rmtree(short, ignore_errors=True)


def cdi_names(daemon: DaemonProcess) -> set[str]:
    """Every fully qualified CDI device name in the daemon's CDI spec directory."""
    names = set()
    for spec_file in (daemon.tmp / "state" / "cdi").glob("*.json"):
        spec = json.loads(spec_file.read_text())
        names |= {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    return names
