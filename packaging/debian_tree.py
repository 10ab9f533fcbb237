"""A minimal Debian tree made with debootstrap once and cached: the root file system of the container image
(packaging/build-image.sh) and of the .deb's boot test under systemd-nspawn (tests/support/nspawn.py).

The tree is made from the Debian mirror apt already uses, for the host's suite and architecture, and cached under
``<repo>/.cache/nspawn/`` or ``$XPU_NSPAWN_CACHE`` (keyed by suite, mirror, architecture and package list; a lock
serialises concurrent builds; about 240 MB). Users of the tree never change it: they copy it or put an overlay on it.

    python3 packaging/debian_tree.py      # prints the tree's path, building it first when it is not cached

Standard library only (it runs before any virtualenv exists).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# XPU_NSPAWN_CACHE points at a directory that outlives the checkout (a CI cache); the repository's .cache/ else.
CACHE = Path(os.environ.get("XPU_NSPAWN_CACHE") or REPO / ".cache" / "nspawn")
# systemd as PID 1, Python for the package's virtualenv; init-system-helpers (deb-systemd-helper) is essential
# anyway. Deliberately absent: procps (so /bin/kill is missing, as on a minimal system) and dbus.
PACKAGES = ("systemd", "systemd-sysv", "init-system-helpers", "python3", "libsystemd0", "util-linux")
RECIPE = 1  # bump to rebuild cached trees after changing how they are made


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
        print(f"debian_tree: building the cached tree: {' '.join(command)}", file=sys.stderr)
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


def main() -> int:
    if shutil.which("debootstrap") is None:
        print("debian_tree: debootstrap is not installed (apt-get install debootstrap)", file=sys.stderr)
        return 2
    print(cached_tree())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
