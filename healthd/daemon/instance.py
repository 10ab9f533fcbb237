"""One daemon per node: an exclusive lock on the state directory, and sockets nobody else serves.

The lock is ``flock`` on ``<state dir>/healthd.lock``, taken before the daemon builds anything (so a second start
rewrites none of the first one's files, the simulated node's included) and held for the daemon's life; the kernel
drops it when the process ends, however it ends. The file records who holds it (pid, sockets, metrics address), so
a refused start names the daemon in the way. Then every unix socket the daemon would listen on, the admin socket
included, must be free: a socket another live process serves is refused, never unlinked (healthd/rpc/sockets.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healthd.daemon.config import Config
from healthd.daemon.startup import OptionNames, StartupError
from healthd.rpc.sockets import SocketInUseError, serving_pid

LOCK_FILE = "healthd.lock"
LOCK_MODE = 0o640


@dataclass(slots=True)
class InstanceLock:
    """The held lock; ``release()`` (idempotent) lets the next daemon start."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


def daemon_sockets(config: Config) -> list[tuple[str, Path]]:
    """(setting, path) of every unix socket the daemon listens on: the main ones and the admin socket."""
    sockets = [("grpc_listen", Path(a[len("unix:") :])) for a in config.grpc_addresses if a.startswith("unix:")]
    return [*sockets, ("admin_socket", config.admin_socket)]


def lock_state_dir(state_dir: Path, names: OptionNames, record: dict[str, Any] | None = None) -> InstanceLock:
    """Take the state directory's lock or raise StartupError naming the daemon that holds it.

    ``record`` (pid, sockets, metrics) is written into the lock file once it is ours."""
    path = state_dir / LOCK_FILE
    where = names.where("state_dir", str(state_dir))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_MODE)
    except OSError as exc:
        raise StartupError(f"{where}: cannot open {path.name}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_record(fd)
        os.close(fd)
        raise StartupError(f"{where}: in use by another xpu-healthd ({_describe(holder)}); stop it first") from None
    except OSError as exc:
        os.close(fd)
        raise StartupError(f"{where}: cannot lock {path.name}: {exc.strerror or exc}") from None
    if record is not None:
        text = json.dumps(record, sort_keys=True).encode() + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    return InstanceLock(path, fd)


def claim_node(config: Config, names: OptionNames) -> InstanceLock:
    """The start-up check: this daemon alone on its state directory and its sockets, else StartupError."""
    sockets = daemon_sockets(config)
    record = {
        "pid": os.getpid(),
        "sockets": [str(path) for _, path in sockets],
        "metrics_listen": config.metrics_listen,
    }
    lock = lock_state_dir(config.state_dir, names, record)
    try:
        for setting, path in sockets:
            _check_free(setting, path, names)
    except BaseException:
        lock.release()
        raise
    return lock


def _check_free(setting: str, path: Path, names: OptionNames) -> None:
    where = names.where(setting, f"unix:{path}" if setting == "grpc_listen" else str(path))
    try:
        pid = serving_pid(path)
    except SocketInUseError as exc:
        raise StartupError(f"{where}: {exc}") from None
    if pid is not None:
        raise StartupError(
            f"{where}: {path} is served by a running process, pid {pid}{_lock_holder_of(pid)}; stop it first, "
            "or give this daemon its own socket paths"
        )


def _lock_holder_of(pid: int) -> str:
    """``(xpu-healthd)`` when /proc says the process is the daemon; the message should say what holds the path."""
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if any(b"healthd" in part for part in cmdline[:3]):
            return " (xpu-healthd)"
    return ""


def _read_record(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    pid = holder.get("pid")
    sockets = holder.get("sockets")
    parts = [f"pid {pid}" if isinstance(pid, int) else "pid unknown"]
    if isinstance(sockets, list) and sockets:
        parts.append("sockets " + ", ".join(str(s) for s in sockets[:4]))
    if isinstance(holder.get("metrics_listen"), str):
        parts.append(f"metrics {holder['metrics_listen']}")
    return "; ".join(parts)
