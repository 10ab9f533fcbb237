"""CUDA MPS control daemons: one per TDM partition, each with its own pipe directory and its quota as defaults.

Why one per partition: on a real H200 the control daemon's defaults (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``) are ceilings a client cannot raise through its environment, while a
client's own ``CUDA_MPS_*`` env can only lower them (the measurements are in docs/partitioning.md). One daemon per
card would have to default to the largest quota on the card, so a tampering client could take more than its
partition holds.
A daemon per partition, defaulted to exactly that partition's quota, holds the quota whatever the client sets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from healthd.partition.mps_launch import Launcher, LaunchError, launcher_from_env
from healthd.partition.mps_spec import MpsDaemonSpec

log = structlog.get_logger("partition.mps")

MPS_CONTROL_BINARY = "nvidia-cuda-mps-control"


class MpsError(Exception):
    pass


class MpsControl(Protocol):
    """Starts, checks and stops one control daemon (the NVIDIA binary, or the simulated stand-in)."""

    name: str

    def start(self, spec: MpsDaemonSpec) -> None: ...

    def alive(self, spec: MpsDaemonSpec) -> bool: ...

    def stop(self, spec: MpsDaemonSpec) -> None: ...


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NvidiaMpsControl:
    """The real control daemon: ``nvidia-cuda-mps-control -d``; commands go to ``nvidia-cuda-mps-control`` on stdin.

    ``launcher`` decides how ``-d`` is run (mps_launch.py): as our child, or as a transient systemd unit outside the
    daemon's sandbox; by default the one ``XPU_MPS_LAUNCH`` names.
    """

    name = "nvidia"

    def __init__(
        self,
        binary: str = MPS_CONTROL_BINARY,
        *,
        timeout_s: float = 10.0,
        run: Runner = subprocess.run,
        launcher: Launcher | None = None,
    ):
        self._binary = binary
        self._timeout = timeout_s
        self._run = run
        self.launcher = launcher if launcher is not None else launcher_from_env()

    def _env(self, spec: MpsDaemonSpec) -> dict[str, str]:
        return {**os.environ, **spec.env()}

    def command(self, spec: MpsDaemonSpec, text: str) -> str:
        """Send ``text`` to the control daemon of ``spec``; any failure is an MpsError naming what was asked."""
        try:
            done = self._run(
                [self._binary],
                input=text + "\n",
                env=self._env(spec),
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{self._binary} {text!r}: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            raise MpsError(f"{self._binary} {text!r} failed ({done.returncode}): {detail}")
        return str(done.stdout).strip()

    def start(self, spec: MpsDaemonSpec) -> None:
        _make_dirs(spec)
        try:
            self.launcher.launch(self._binary, spec, self._env(spec), self._timeout)
        except LaunchError as exc:
            raise MpsError(str(exc)) from exc
        try:
            for text in spec.default_commands():
                self.command(spec, text)
        except MpsError:
            self.stop(spec)  # never leave a daemon running without its quota
            raise

    def alive(self, spec: MpsDaemonSpec) -> bool:
        if not (spec.pipe_dir / "control").exists():
            return False
        try:
            self.command(spec, "get_server_list")
        except MpsError:
            return False
        return True

    def stop(self, spec: MpsDaemonSpec) -> None:
        try:
            self.command(spec, "quit")
        except MpsError as exc:
            log.info("mps control daemon was not running", daemon=spec.daemon_id, detail=str(exc))


@dataclass
class _SimDaemon:
    spec: MpsDaemonSpec
    defaults: dict[str, str] = field(default_factory=dict)


class SimulatedMpsControl:
    """A stand-in for nodes without MPS (the simulated node, CI): keeps daemons as in-process objects.

    It accepts the same command text the real daemon gets and records it, creates the same directories and a
    ``control`` marker, and lets tests kill a daemon to exercise restarts. It enforces nothing on any GPU.
    """

    name = "simulated"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._daemons: dict[str, _SimDaemon] = {}
        self.starts = 0
        self.commands: list[tuple[str, str]] = []  # (partition id, command text)

    def start(self, spec: MpsDaemonSpec) -> None:
        _make_dirs(spec)
        (spec.pipe_dir / "control").touch()
        daemon = _SimDaemon(spec)
        for text in spec.default_commands():
            verb, _, arg = text.partition(" ")
            daemon.defaults[verb] = arg
        with self._lock:
            self._daemons[spec.daemon_id] = daemon
            self.starts += 1
            self.commands.extend((spec.daemon_id, t) for t in spec.default_commands())

    def alive(self, spec: MpsDaemonSpec) -> bool:
        with self._lock:
            return spec.daemon_id in self._daemons

    def stop(self, spec: MpsDaemonSpec) -> None:
        with self._lock:
            self._daemons.pop(spec.daemon_id, None)
            self.commands.append((spec.daemon_id, "quit"))
        (spec.pipe_dir / "control").unlink(missing_ok=True)

    def kill(self, daemon_id: str) -> None:
        """Simulate the daemon dying (crash, OOM kill)."""
        with self._lock:
            self._daemons.pop(daemon_id, None)

    def defaults(self, daemon_id: str) -> Mapping[str, str]:
        with self._lock:
            daemon = self._daemons.get(daemon_id)
            return dict(daemon.defaults) if daemon else {}

    def running(self) -> set[str]:
        with self._lock:
            return set(self._daemons)


# Modes of the MPS directories: <runtime_dir>/mps/ and mps/<id>/ hold a partition's pipe/ and log/.
#
# What needs them: the control daemon runs as root, but it starts each MPS server under the uid of the client that
# asked (nvidia-cuda-mps-control(1): "launches an MPS server with the same user id (UID) as that of the requesting
# client process"), and that server opens <pipe>/log and connects to <pipe>/control, the daemon's own endpoints
# (as traced on driver 580 in bottlerocket-os/bottlerocket#4673, where a 0700 directory above the pipe directory
# made a uid-1000 server exit with EACCES on both). A client outside a container also connects to <pipe>/control
# by its host path. So every directory from the runtime directory down to pipe/ must be searchable by any uid:
# 0755, whatever the daemon's umask (the packaged unit's UMask=0027 would make them 0750).
#
# What is not made world-writable, and why that is safe: none of these directories is, log/ included. The
# endpoints in pipe/ are the control daemon's: it creates them, as root, with the modes it needs to serve clients
# of any uid (it does so in its default /tmp/nvidia-mps too). The log directory needs no write access from a
# server either: the traced server wrote to <pipe>/log, NVIDIA's default log directory /var/log/nvidia-mps is
# "typically only visible to users with administrative privileges" (MPS guide, Logging appendix) while MPS serves
# every user from it, and NVIDIA's own device plugin creates both directories root-owned 0755
# (k8s-device-plugin, cmd/mps-control-daemon/mps/daemon.go) and serves uid-1000 pods from them on driver 580
# (the same Bottlerocket report, once the directory above was 0755). Root-owned and writable by root alone, no
# client, in a container or on the host, can replace, rename or plant entries in a partition's directories (the
# pipe directory that containers mount included), or fill the /run tmpfs through them.
MPS_DIR_MODE = 0o755


def _make_dirs(spec: MpsDaemonSpec) -> None:
    """mps/, mps/<id>/, pipe/ and log/ exist with MPS_DIR_MODE (also when an older version made them otherwise)."""
    partition_dir = spec.pipe_dir.parent
    for directory in (partition_dir.parent, partition_dir, spec.pipe_dir, spec.log_dir):
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, MPS_DIR_MODE)


class MpsSupervisor:
    """Keeps one control daemon per TDM partition alive; ``check`` restarts the ones that died."""

    def __init__(self, control: MpsControl, runtime_dir: Path) -> None:
        self.control = control
        self._root = runtime_dir / "mps"
        self._specs: dict[str, MpsDaemonSpec] = {}
        self._lock = threading.Lock()
        self.restarts = 0

    def spec_for(self, daemon_id: str, gpu_uuid: str, compute_percent: int, memory_mib: int) -> MpsDaemonSpec:
        base = self._root / daemon_id
        return MpsDaemonSpec(
            daemon_id=daemon_id,
            gpu_uuid=gpu_uuid,
            pipe_dir=base / "pipe",
            log_dir=base / "log",
            active_thread_percentage=compute_percent,
            pinned_memory_mib=memory_mib,
        )

    def ensure(self, spec: MpsDaemonSpec) -> None:
        """Start the daemon unless it already runs (as after a restart of ours, when it kept running)."""
        if not self.control.alive(spec):
            try:
                self.control.start(spec)
            except MpsError:
                shutil.rmtree(spec.pipe_dir.parent, ignore_errors=True)
                raise
        with self._lock:
            self._specs[spec.daemon_id] = spec

    def release(self, spec: MpsDaemonSpec) -> None:
        """Stop the partition's daemon (known to us or not, as after a restart) and remove its directories."""
        with self._lock:
            self._specs.pop(spec.daemon_id, None)
        self.control.stop(spec)
        shutil.rmtree(spec.pipe_dir.parent, ignore_errors=True)

    def check(self) -> list[str]:
        """Restart dead daemons; returns the partition ids restarted."""
        with self._lock:
            specs = list(self._specs.values())
        restarted = []
        for spec in specs:
            if self.control.alive(spec):
                continue
            log.warning("mps control daemon died; restarting", daemon=spec.daemon_id)
            try:
                self.control.start(spec)
            except MpsError as exc:
                log.error("mps restart failed", daemon=spec.daemon_id, error=str(exc))
                continue
            self.restarts += 1
            restarted.append(spec.daemon_id)
        return restarted

    def known(self) -> set[str]:
        with self._lock:
            return set(self._specs)
