"""The pieces of a DRA end-to-end test: the simulated xpu-healthd process, the API server stand-in
(tests/support/kube_api.py), xpu-dra-driver as a process with its real command line, and the kubelet DRA double
(tests/support/kubelet_dra.py) on the driver's registry directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from healthd.api.v1 import partitions_pb2 as ppb
from healthd.api.v1 import partitions_pb2_grpc as ppb_grpc
from tests.support.daemon_process import DaemonProcess
from tests.support.kube_api import KubeApiServer
from tests.support.kubelet_dra import KubeletDra
from tests.support.paths import REPO
from tests.support.servicehelpers import terminate

NODE = "node-a"
DRIVER = "gpu.xpu-runtime-kit.io"
DAEMON_CONFIG = "[partitions]\nreconcile_interval_seconds = 0.5\nowner_grace_seconds = 0\n"


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for the stand-in: plain HTTP on loopback, no credentials (it checks none)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "driver", "user": {}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "driver"}}],
        "current-context": "stand-in",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


class DriverProcess:
    def __init__(self, daemon: DaemonProcess, api: KubeApiServer, short: Path, tmp: Path, config: str) -> None:
        self.registry_dir = short / "plugins_registry"
        self.plugin_dir = short / "plugins" / DRIVER
        self.config_file = tmp / "driver.toml"
        self.config_file.write_text(config)
        self.args = [
            sys.executable,
            "-m",
            "container.dra",
            "--healthd-socket",
            daemon.address,
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig(tmp / "kubeconfig", api.url)),
            "--kubelet-registry-dir",
            str(self.registry_dir),
            "--kubelet-plugin-dir",
            str(self.plugin_dir),
            "--config",
            str(self.config_file),
        ]
        self.log = tmp / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DriverProcess:
        self._out = self.log.open("ab")
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return self

    def stop(self) -> int:
        assert self.proc is not None
        terminate(self.proc)
        self._out.close()
        return self.proc.returncode

    def kill9(self) -> None:
        """SIGKILL: no clean-up at all (its sockets stay behind, as after a crash)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    @property
    def checkpoint(self) -> dict[str, Any]:
        path = self.plugin_dir / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else {}


@dataclass
class DraStack:
    daemon: DaemonProcess
    api: KubeApiServer
    driver: DriverProcess
    kubelet: KubeletDra

    @property
    def admin(self) -> str:
        return f"unix:{self.daemon.tmp}/healthd-admin.sock"

    def partitions(self) -> list[Any]:
        with grpc.insecure_channel(self.daemon.address) as channel:
            stub = ppb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]
            return list(stub.ListPartitions(ppb.ListPartitionsRequest(), timeout=10).partitions)

    def set_mode(self, gpu: str, mode: int) -> None:
        with grpc.insecure_channel(self.admin) as channel:
            stub = ppb_grpc.PartitionsStub(channel)  # type: ignore[no-untyped-call]
            stub.SetCardMode(ppb.SetCardModeRequest(gpu=gpu, mode=mode), timeout=20)

    def devices(self) -> dict[str, dict[str, Any]]:
        """Every published device by name (from the stand-in's store)."""
        return {
            d["name"]: d
            for s in self.api.items("resourceslices")
            if s["spec"]["driver"] == DRIVER
            for d in s["spec"].get("devices") or ()
        }

    def register(self) -> bool:
        return DRIVER in self.kubelet.register()


@contextmanager
def dra_stack(
    tmp: Path,
    *,
    driver_config: str = "",
    modes: dict[str, int] | None = None,
    daemon_extra: str = "",
    validate: bool = True,
) -> Iterator[DraStack]:
    """The daemon (with card ``modes`` set before the driver starts), the stand-in with this node, the driver.
    ``validate``: the stand-in checks every write against the 1.36 and 1.37 schemas (a bench turns it off, so
    its figures hold less of the stand-in's own time)."""
    short = Path(tempfile.mkdtemp(prefix="xdra-", dir="/tmp"))  # unix socket paths are short
    daemon = DaemonProcess(tmp, extra_config=DAEMON_CONFIG + daemon_extra)
    api = (KubeApiServer() if validate else KubeApiServer(versions=())).start()
    api.add("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    driver: DriverProcess | None = None
    kubelet = KubeletDra(short / "plugins_registry")
    try:
        daemon.start()
        stack = DraStack(daemon, api, DriverProcess(daemon, api, short, tmp, driver_config), kubelet)
        for gpu, mode in (modes or {}).items():
            stack.set_mode(gpu, mode)
        driver = stack.driver.start()
        yield stack
    finally:
        kubelet.close()
        if driver is not None and driver.proc is not None and driver.proc.poll() is None:
            driver.stop()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        api.stop()
        shutil.rmtree(short, ignore_errors=True)
