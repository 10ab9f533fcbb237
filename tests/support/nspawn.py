"""A minimal Debian tree booted with systemd as PID 1 under systemd-nspawn, for testing the .deb under real systemd.

The tree is made once with debootstrap from the Debian mirror apt already uses and cached under
``<repo>/.cache/nspawn/`` or ``$XPU_NSPAWN_CACHE`` (keyed by suite, mirror, architecture and package list; a lock
serialises concurrent builds; about 240 MB). Each boot runs on a throwaway overlay (``--volatile=overlay``), so the
cached tree stays pristine. Commands run inside through ``nsenter`` into the container's namespaces. Where the host's
PID 1 is not systemd, nspawn gets ``--keep-unit --register=no`` (no machined, no scope unit to ask for).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.servicehelpers import REPO

# XPU_NSPAWN_CACHE points at a directory that outlives the checkout (a CI cache); the repository's .cache/ else.
CACHE = Path(os.environ.get("XPU_NSPAWN_CACHE") or REPO / ".cache" / "nspawn")
# systemd as PID 1, Python for the package's virtualenv; init-system-helpers (deb-systemd-helper) is essential
# anyway. Deliberately absent: procps (so /bin/kill is missing, as on a minimal system) and dbus.
PACKAGES = ("systemd", "systemd-sysv", "init-system-helpers", "python3", "libsystemd0", "util-linux")
RECIPE = 1  # bump to rebuild cached trees after changing how they are made
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


def host_codename(os_release: Path = Path("/etc/os-release")) -> str:
    fields = dict(line.split("=", 1) for line in os_release.read_text().splitlines() if "=" in line)
    return fields.get("VERSION_CODENAME", "").strip('"') or "bookworm"


def apt_mirror(codename: str, etc_apt: Path = Path("/etc/apt")) -> str:
    """The URI of the first apt source (one-line or deb822) that serves ``codename`` main; deb.debian.org else."""
    files = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {k.strip(): v.split() for k, _, v in (line.partition(":") for line in stanza.splitlines())}
                wanted = ("deb", "Types"), (codename, "Suites"), ("main", "Components")
                if all(value in fields.get(key, []) for value, key in wanted) and fields.get("URIs"):
                    return fields["URIs"][0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == codename and "main" in words[3:]:
                    return words[1]
    return "http://deb.debian.org/debian"


def cached_tree(cache: Path = CACHE) -> Path:
    """The booted tree for the host's Debian suite, made with debootstrap on first use."""
    codename = host_codename()
    mirror = apt_mirror(codename)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    key = hashlib.sha256(repr((RECIPE, codename, mirror, arch, PACKAGES)).encode()).hexdigest()[:12]
    tree = cache / f"{codename}-{arch}-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (tree / "usr/lib/systemd/systemd").exists():
            return tree
        work = cache / f".build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            f"--arch={arch}",
            codename,
            str(work),
            mirror,
        ]
        print(f"nspawn: building the cached tree: {' '.join(command)}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(f"debootstrap failed ({done.returncode}): {done.stdout[-3000:]}{done.stderr[-3000:]}")
        for old in cache.glob(f"{codename}-{arch}-*"):  # trees of an older recipe or mirror
            if old != tree:
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(work / "var/cache/apt/archives", ignore_errors=True)
        work.rename(tree)
        return tree


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
        command = [*nspawn_base(tree, self.machine, binds), "--boot", "--console=pipe"]
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
