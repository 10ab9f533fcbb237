"""How a partition's MPS control daemon is started: as a child that daemonises itself, or as a transient systemd unit.

Both run ``nvidia-cuda-mps-control -d``, whose parent process exits once the forked control daemon listens, and
neither ever reads the daemon's output through a pipe. A daemonised child keeps the stdout it inherited; had we
captured it, the call would wait for that pipe to close, time out, and the caller would then remove a live daemon's
directories.

Under the packaged systemd unit (``XPU_MPS_LAUNCH=systemd-run``) the control daemon runs as a transient service in
``xpu-mps.slice``, started by systemd itself: outside xpu-healthd's sandbox (the CUDA MPS server needs
writable-executable memory, setrlimit and setuid for clients of other users, which the daemon's unit forbids), and
outside its cgroup, so clients keep their server while xpu-healthd restarts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Protocol

from healthd.partition.mps_spec import MpsDaemonSpec

LAUNCH_ENV = "XPU_MPS_LAUNCH"
MPS_SLICE = "xpu-mps.slice"
START_ERRORS_FILE = "control-start.err"  # in the partition's log directory: the -d parent's stderr

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class LaunchError(Exception):
    pass


class Launcher(Protocol):
    name: str

    def launch(self, binary: str, spec: MpsDaemonSpec, env: Mapping[str, str], timeout: float) -> None:
        """Start the control daemon for ``spec``; return once it listens. Raises LaunchError."""
        ...


class DetachedLauncher:
    """``nvidia-cuda-mps-control -d`` as our child, in its own session, with its stdio on /dev/null and a file.

    Only the parent's exit is awaited. Its stderr goes to a regular file in the partition's log directory (never a
    pipe), so a failure can be reported without anything able to hold the call open.
    """

    name = "direct"

    def launch(self, binary: str, spec: MpsDaemonSpec, env: Mapping[str, str], timeout: float) -> None:
        errors_path = spec.log_dir / START_ERRORS_FILE
        try:
            with open(errors_path, "w+b") as errors:
                proc = subprocess.Popen(
                    [binary, "-d"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    env=dict(env),
                    start_new_session=True,
                    close_fds=True,
                )
                try:
                    code = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise LaunchError(f"{binary} -d did not return within {timeout:g}s") from None
        except OSError as exc:
            raise LaunchError(f"{binary} -d: {exc}") from exc
        if code != 0:
            detail = errors_path.read_text(errors="replace").strip()
            raise LaunchError(f"{binary} -d failed ({code}): {detail}")


class TransientUnitLauncher:
    """``systemd-run`` starts ``nvidia-cuda-mps-control -d`` as ``xpu-mps-<partition>.service`` (Type=forking).

    systemd-run waits for the start job, which completes when the ``-d`` parent exits, that is once the control
    daemon listens. ``--collect`` unloads the unit when the daemon ends (``quit``, crash), so the name is free for a
    restart; a leftover unit of that name (one that no longer answered, or so ``alive`` said) is stopped first.
    Its output is systemd-run's own, never the daemon's, so capturing it cannot block.
    """

    name = "systemd-run"

    def __init__(self, systemd_run: str = "systemd-run", systemctl: str = "systemctl", run: Runner = subprocess.run):
        self._systemd_run = systemd_run
        self._systemctl = systemctl
        self._run = run

    def launch(self, binary: str, spec: MpsDaemonSpec, env: Mapping[str, str], timeout: float) -> None:
        path = shutil.which(binary, path=env.get("PATH", os.defpath))
        if path is None:
            raise LaunchError(f"{binary}: not found")
        unit = mps_unit_name(spec.daemon_id)
        self._call([self._systemctl, "stop", unit], timeout, f"systemctl stop {unit}", check=False)
        command = [
            self._systemd_run,
            "--quiet",
            "--collect",
            f"--unit={unit}",
            f"--slice={MPS_SLICE}",
            f"--description=CUDA MPS control daemon of xpu-healthd ({spec.daemon_id})",
            "--service-type=forking",
            f"--property=TimeoutStartSec={max(1, int(timeout))}s",
            *(f"--setenv={key}={value}" for key, value in sorted(spec.env().items())),
            "--",
            os.path.abspath(path),
            "-d",
        ]
        self._call(command, timeout, f"systemd-run {unit}", check=True)

    def _call(self, command: list[str], timeout: float, what: str, *, check: bool) -> None:
        try:
            done = self._run(command, capture_output=True, text=True, timeout=timeout + 5, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"{what}: {exc}") from exc
        if check and done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            raise LaunchError(f"{what} failed ({done.returncode}): {detail}")


_UNIT_SAFE = re.compile(r"[A-Za-z0-9:_.-]")


def mps_unit_name(daemon_id: str) -> str:
    """``xpu-mps-<id>.service``; other characters become \\xNN, as in systemd unit names."""
    escaped = "".join(c if _UNIT_SAFE.fullmatch(c) else _escape(c) for c in daemon_id)
    return f"xpu-mps-{escaped}.service"


def _escape(char: str) -> str:
    return "".join(f"\\x{byte:02x}" for byte in char.encode())


def launcher_from_env(env: Mapping[str, str] | None = None) -> Launcher:
    """The launcher ``XPU_MPS_LAUNCH`` names: ``direct`` (the default) or ``systemd-run`` (the packaged unit)."""
    value = (os.environ if env is None else env).get(LAUNCH_ENV, "") or "direct"
    if value == "direct":
        return DetachedLauncher()
    if value == "systemd-run":
        return TransientUnitLauncher()
    raise ValueError(f"{LAUNCH_ENV}: must be direct or systemd-run, got {value!r}")
