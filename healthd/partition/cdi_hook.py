"""``xpu-cdi-hook update-ldcache``: a CDI createContainer hook that refreshes a container's ld.so cache.

nvidia-container-toolkit's specs run ``nvidia-cdi-hook update-ldcache --folder DIR``: it adds the folders of the
mounted driver libraries to the container's loader configuration and rebuilds its ``/etc/ld.so.cache``, so images
whose loader does not search the host's library directory (a RHEL-family image on a Debian host, say) still find
``libcuda.so.1``. This is the same job for nodes without the toolkit:

1. The OCI runtime passes the container state on stdin; its ``bundle`` holds ``config.json`` whose ``root.path``
   is the container's root file system. The hook runs after the mounts and before the runtime switches root.
2. ``/etc/ld.so.conf.d/00-xpu-runtime-kit.conf`` is written with the folders by a child process that has
   ``chroot``-ed into that root, so a symlink planted in the image resolves inside the container, never on the host.
3. The host's ``ldconfig -r ROOT -f /etc/ld.so.conf -C /etc/ld.so.cache FOLDER...`` rebuilds the cache: ldconfig
   enters the root itself and takes the folders even when the image has no ld.so.conf. The host's binary is used,
   never one from the image (like nvidia-cdi-hook). Unlike nvidia-cdi-hook, a cache is also built in an image that
   had none, so the libraries are found there too.

An image without ``/etc`` (distroless) is left alone. Errors exit non-zero with one line on stderr; the runtime
then refuses to start the container and shows that line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONF_NAME = "00-xpu-runtime-kit.conf"
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")  # Ubuntu wraps .real
MAX_STATE_BYTES = 1 << 20
NO_ETC = 3  # the child's exit code when the image has no /etc


class HookError(Exception):
    pass


def container_root(state: Any) -> Path:
    """The root file system from the OCI state: ``<bundle>/config.json`` -> ``root.path`` (relative to the bundle)."""
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str) or not state["bundle"]:
        raise HookError("the OCI state on stdin has no bundle")
    bundle = Path(state["bundle"])
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise HookError(f"cannot read {bundle / 'config.json'}: {exc}") from exc
    root = config.get("root", {}).get("path") if isinstance(config, dict) else None
    if not isinstance(root, str) or not root:
        raise HookError(f"{bundle / 'config.json'} names no root.path")
    path = Path(root) if Path(root).is_absolute() else bundle / root
    if not path.is_dir():
        raise HookError(f"container root {path} is not a directory")
    return path


def write_conf_inside(root: Path, folders: Sequence[str]) -> bool:
    """Write the loader configuration from inside the container's root; False when the image has no /etc."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is lost at _exit; its effects are tested
        code = 1
        try:
            os.chroot(root)
            os.chdir("/")
            if not os.path.isdir("/etc"):
                code = NO_ETC
            else:
                if os.path.isdir("/etc/ld.so.conf.d"):
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                    fd = os.open(f"/etc/ld.so.conf.d/{CONF_NAME}", flags, 0o644)
                    try:
                        os.write(fd, "".join(f"{f}\n" for f in folders).encode())
                    finally:
                        os.close(fd)
                code = 0
        except OSError as exc:
            os.write(2, f"xpu-cdi-hook: writing the loader configuration: {exc}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == NO_ETC:
        return False
    if code != 0:
        raise HookError(f"cannot write /etc/ld.so.conf.d/{CONF_NAME} in {root} (exit {code})")
    return True


def find_ldconfig() -> str:
    for candidate in LDCONFIG_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise HookError("ldconfig not found in " + ", ".join(LDCONFIG_CANDIDATES))


def update_ldcache(state: Any, folders: Sequence[str], ldconfig: str | None = None) -> str:
    root = container_root(state)
    for folder in folders:
        if not folder.startswith("/") or "\n" in folder:
            raise HookError(f"--folder must be an absolute path, got {folder[:100]!r}")
    if not write_conf_inside(root, folders):
        return f"{root} has no /etc; ld.so cache left alone"
    exe = ldconfig or find_ldconfig()
    # -f and -C name the container's files explicitly: the host's ldconfig may be built with other defaults
    args = [exe, "-r", str(root), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache", *folders]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise HookError(f"{exe} -r {root} failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    return f"ld.so cache of {root} updated with {', '.join(folders)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpu-cdi-hook", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    upd = sub.add_parser("update-ldcache", help="add library folders to the container's ld.so cache")
    upd.add_argument("--folder", action="append", default=[], help="a folder of mounted libraries (repeatable)")
    upd.add_argument("--ldconfig", default=None, help="the host's ldconfig (default: found in /sbin, /usr/sbin)")
    args = parser.parse_args(argv)
    try:
        raw = sys.stdin.buffer.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise HookError("the OCI state on stdin is larger than 1 MiB")
        try:
            state = json.loads(raw)
        except ValueError as exc:
            raise HookError(f"the OCI state on stdin is not JSON: {exc}") from exc
        message = update_ldcache(state, args.folder, args.ldconfig)
    except (HookError, OSError, subprocess.SubprocessError) as exc:
        print(f"xpu-cdi-hook: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("XPU_CDI_HOOK_VERBOSE"):
        print(f"xpu-cdi-hook: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
