"""A minimal Debian tree booted with systemd as PID 1 under systemd-nspawn, for testing the .deb under real systemd.

The tree is packaging/debian_tree.py's (debootstrapped once and cached; the container image is built from the same
tree). Each boot runs on a throwaway overlay (``--volatile=overlay``), so the cached tree stays pristine. Commands run
inside through ``nsenter`` into the container's namespaces. Where the host's PID 1 is not systemd, nspawn gets
``--keep-unit --register=no`` (no machined, no scope unit to ask for). A booted container has a network namespace of
its own (``--private-network``, loopback only): its daemon binds :9410 whatever the host runs (``./dev run``, say).
"""

from __future__ import annotations

import contextlib
import importlib.util
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from tests.support.servicehelpers import REPO


def _debian_tree() -> ModuleType:
    """packaging/debian_tree.py, a script (packaging/ is no Python package: PyPI has one of that name)."""
    spec = importlib.util.spec_from_file_location("xpu_debian_tree", REPO / "packaging" / "debian_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


debian_tree = _debian_tree()
cached_tree = debian_tree.cached_tree
CACHE = debian_tree.CACHE
PACKAGES = debian_tree.PACKAGES
INSIDE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_tools() -> list[str]:
    return [tool for tool in ("systemd-nspawn", "debootstrap", "nsenter", "unshare") if shutil.which(tool) is None]


def namespaces_forbidden() -> str | None:
    """Why the kernel refuses the namespaces nspawn needs, or None when it allows them."""
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--uts", "--ipc", "--net", "--fork", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return None if probe.returncode == 0 else f"unshare of mount/pid/uts/ipc/net namespaces failed: {probe.stderr}"


def host_runs_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def nspawn_base(tree: Path, machine: str, binds: Sequence[tuple[Path, str]]) -> list[str]:
    command = ["systemd-nspawn", "--quiet", f"--directory={tree}", "--volatile=overlay", f"--machine={machine}"]
    if not host_runs_systemd():
        command += ["--keep-unit", "--register=no"]
    command += [f"--bind-ro={source}:{target}" for source, target in binds]
    return command


def run_in_image(tree: Path, binds: Sequence[tuple[Path, str]], script: str, timeout: float = 300) -> str:
    """Run ``script`` with /bin/sh in the tree without booting it: an image being built, no systemd running."""
    machine = f"xpu-img-{secrets.token_hex(4)}"
    command = [*nspawn_base(tree, machine, binds), "--pipe", "--setenv=PATH=" + INSIDE_PATH, "/bin/sh", "-ec", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"in the image, exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Booted:
    """A container with systemd as PID 1; ``sh`` runs a shell command inside it as root."""

    def __init__(self, tree: Path, binds: Sequence[tuple[Path, str]], log: Path) -> None:
        self.machine = f"xpu-{secrets.token_hex(4)}"
        self.log = log
        command = [*nspawn_base(tree, self.machine, binds), "--boot", "--console=pipe", "--private-network"]
        self._log_file = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT)
        self.leader = self._find_leader(timeout=60)

    def _find_leader(self, timeout: float) -> int:
        """The container's PID 1 as the host sees it: a descendant of nspawn whose innermost pid is 1."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            for status in Path("/proc").glob("[0-9]*/status"):
                with contextlib.suppress(OSError):
                    fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
                    nspid = fields.get("NSpid", "").split()
                    if len(nspid) > 1 and nspid[-1] == "1" and self._descends(int(nspid[0])):
                        return int(nspid[0])
            time.sleep(0.2)
        raise RuntimeError(f"no container PID 1 within {timeout}s: {self.log.read_text()[-3000:]}")

    def _descends(self, pid: int) -> bool:
        while pid > 1:
            if pid == self.proc.pid:
                return True
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        return False

    def sh(self, script: str, *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [
            "nsenter",
            f"--target={self.leader}",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--cgroup",
            "--root",
            "--wd",
            "--",
            "/usr/bin/env",
            "-i",
            f"PATH={INSIDE_PATH}",
            "LANG=C.UTF-8",
            "SYSTEMD_PAGER=",
            "/bin/sh",
            "-c",
            script,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check:
            assert done.returncode == 0, f"{script!r}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def out(self, script: str, *, timeout: float = 120) -> str:
        return self.sh(script, timeout=timeout).stdout.strip()

    def wait_for(self, script: str, *, timeout: float = 60, what: str = "") -> str:
        """Repeat ``script`` until it succeeds; its output, or an AssertionError naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.sh(script, check=False)
            if done.returncode == 0:
                return done.stdout.strip()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what or script} not within {timeout}s: {done.stdout}{done.stderr}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to power off
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@contextlib.contextmanager
def booted(tree: Path, binds: Sequence[tuple[Path, str]], log: Path) -> Iterator[Booted]:
    container = Booted(tree, binds, log)
    try:
        container.wait_for("systemctl is-system-running --wait | grep -Eq '^(running|degraded)$'", what="boot")
        yield container
    finally:
        container.stop()
