"""Run xpu-healthd as a real process for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.support.ports import free_port
from tests.support.servicehelpers import NotifySocket, terminate


class DaemonProcess:
    """xpu-healthd in simulation on a free port and a unix socket under ``tmp``."""

    def __init__(
        self,
        tmp: Path,
        *,
        scenario: str | None = "h200x8",
        interval: float = 0.3,
        deadline: float = 0.3,
        extra_config: str = "",
        env: dict[str, str] | None = None,
        use_config: bool = True,
        module: Sequence[str] = ("healthd",),
    ) -> None:
        """``module``: what ``python -m`` runs, with its own leading arguments (e.g. tests.support.hung_at_start)."""
        self.tmp = tmp
        self.port = free_port()
        self.socket = tmp / "healthd.sock"
        self.config = tmp / "healthd.toml"
        self.config.write_text(
            f"[sampler]\ninterval_seconds = {interval}\ncall_deadline_seconds = {deadline}\n{extra_config}"
        )
        self.log = tmp / "daemon.log"
        self.args = [
            sys.executable,
            "-m",
            *module,
            "--metrics-listen",
            f"127.0.0.1:{self.port}",
            "--grpc-listen",
            f"unix:{self.socket}",
            "--state-dir",
            str(tmp / "state"),
        ]
        if use_config:
            self.args += ["--config", str(self.config)]
        if scenario is not None:
            self.args += ["--simulate", scenario]
        self.env = {**os.environ, **(env or {})}
        self._caller_notify = "NOTIFY_SOCKET" in self.env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    def start(self, ready_timeout: float = 30.0) -> DaemonProcess:
        """Start it and wait for READY=1 on a notify socket of our own, as systemd would (every component has
        started), unless the caller set NOTIFY_SOCKET itself; then /healthz and the socket are the sign."""
        notify = self._notify_socket()
        self._log_file = self.log.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log_file, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + ready_timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()}")
                if notify is not None:
                    message = notify.next(0.1)
                    if message is not None and message.get("READY") == "1":
                        return self
                    continue
                try:
                    if self.get("/healthz")[0] == 200 and self.socket.exists():
                        return self
                except OSError:
                    pass
                time.sleep(0.1)
        finally:
            if notify is not None:  # later messages fail at once in the daemon (the notifier ignores that)
                notify.close()
                notify.path.unlink(missing_ok=True)
        raise RuntimeError(f"daemon not ready in {ready_timeout}s:\n{self.log.read_text()}")

    def _notify_socket(self) -> NotifySocket | None:
        path = self.tmp / "notify.sock"
        if self._caller_notify or len(str(path)) >= 100:
            return None
        path.unlink(missing_ok=True)
        notify = NotifySocket(path)
        self.env = {**self.env, "NOTIFY_SOCKET": str(path)}
        return notify

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200
        return body

    def xpuctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "healthd.cli", "--socket", self.address, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def stop(self) -> int:
        assert self.proc is not None
        terminate(self.proc)
        self._log_file.close()
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
