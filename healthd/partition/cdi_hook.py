"""``xpu-cdi-hook``: the CDI createContainer hooks of the daemon's spec, for nodes without nvidia-container-toolkit.

nvidia-container-toolkit's specs run ``nvidia-cdi-hook`` three times before a container starts (pkg/nvcdi,
driver-nvml.go: the driver's ``.so`` links, CUDA forward compatibility, then the ld.so cache); these verbs do the
same jobs, in the same order in the spec:

``create-symlinks --link TARGET::LINK``
    makes LINK point to TARGET inside the container (``libcuda.so -> libcuda.so.1``: "many applications wrongly
    assume that libcuda.so exists", internal/discover/symlinks.go). A link already pointing there is left alone;
    anything else at LINK is replaced, and missing parent directories are made (0755).
``enable-cuda-compat --host-driver-version V``
    uses the image's CUDA forward-compatibility libraries (``/usr/local/cuda/compat/libcuda.so.X.Y``, from the
    cuda-compat package) when they are newer than the host's driver and made for its branch, as
    cmd/nvidia-cdi-hook/cudacompat does: the library's ELF note ``.note.cuda.fwd_compatibility`` (owner "NVIDIA
    Corporation", JSON with the driver branches it supports) must list the host's major version and its own version
    must be higher than the host's; without that note, its major must be higher. Then the compat folder is written to
    ``/etc/ld.so.conf.d/00-compat-xpu-runtime-kit.conf``. An image without compat libraries, or with libraries the
    host's driver is as new as, is left alone.
``update-ldcache --folder DIR``
    adds the folders of the mounted driver libraries to ``/etc/ld.so.conf.d/00-xpu-runtime-kit.conf`` and rebuilds
    the container's ``/etc/ld.so.cache`` with the host's ``ldconfig -r ROOT -f /etc/ld.so.conf -C /etc/ld.so.cache``,
    the compat folders first, then DIR...: ldconfig takes folders given on its command line even when the image has
    no ld.so.conf, and those first in line win, so the compat ``libcuda.so.1`` is the one the loader finds. The
    host's binary is used, never one from the image. Unlike nvidia-cdi-hook, a cache is also built in an image that
    had none.

``one-partition --partition ID``
    each partition's own device runs it: it refuses to start a container given two partitions of this spec. Every
    partition sets ``CUDA_VISIBLE_DEVICES`` and a TDM one its MPS variables; a runtime applies both devices' edits
    and the last value of each variable wins, so the container would see one card with another partition's MPS
    settings. The partitions asked for are the ``one-partition`` hooks in the container's ``config.json``.

How every verb works: the OCI runtime passes the container state on stdin; its ``bundle`` holds ``config.json``
whose ``root.path`` is the container's root file system. The hook runs after the mounts and before the runtime
switches root. Every read and write inside the image happens in a child process that has ``chroot``-ed into that
root, so a symlink planted in the image resolves inside the container, never on the host. An image without ``/etc``
(distroless) is left alone. Errors exit non-zero with one line on stderr; the runtime then refuses to start the
container and shows that line. The module imports nothing of the project: it runs as a hook, in the runtime's
environment.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CONF_NAME = "00-xpu-runtime-kit.conf"
COMPAT_CONF_NAME = "00-compat-xpu-runtime-kit.conf"  # toolkit: "00-compat-*.conf", before everything else
COMPAT_CONF = re.compile(r"00-compat-.*\.conf")  # this hook's, the toolkit's, or the image's own
DEFAULT_COMPAT_ROOT = "/usr/local/cuda/compat"
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")  # Ubuntu wraps .real
MAX_STATE_BYTES = 1 << 20
NO_ETC = 3  # the child's exit code when the image has no /etc
COMPAT_NOTE = ".note.cuda.fwd_compatibility"
COMPAT_NOTE_OWNER = b"NVIDIA Corporation"
SHT_NOTE = 7
ONE_PARTITION = "one-partition"


class HookError(Exception):
    pass


def container_config(state: Any) -> tuple[Path, Any]:
    """The bundle directory from the OCI state, and its ``config.json``."""
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str) or not state["bundle"]:
        raise HookError("the OCI state on stdin has no bundle")
    bundle = Path(state["bundle"])
    try:
        return bundle, json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise HookError(f"cannot read {bundle / 'config.json'}: {exc}") from exc


def container_root(state: Any) -> Path:
    """The root file system from the OCI state: ``<bundle>/config.json`` -> ``root.path`` (relative to the bundle)."""
    bundle, config = container_config(state)
    root = config.get("root", {}).get("path") if isinstance(config, dict) else None
    if not isinstance(root, str) or not root:
        raise HookError(f"{bundle / 'config.json'} names no root.path")
    path = Path(root) if Path(root).is_absolute() else bundle / root
    if not path.is_dir():
        raise HookError(f"container root {path} is not a directory")
    return path


def inside(root: Path, what: str, work: Callable[[], bytes]) -> bytes | None:
    """Run ``work`` in a child chrooted into ``root``; its bytes, or None when the image has no /etc."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is lost at _exit; its effects are tested
        code = 1
        try:
            os.close(read_end)
            os.chroot(root)
            os.chdir("/")
            if not os.path.isdir("/etc"):
                code = NO_ETC
            else:
                out = work()
                while out:
                    out = out[os.write(write_end, out) :]
                code = 0
        except (OSError, ValueError) as exc:
            os.write(2, f"xpu-cdi-hook: {what}: {exc}\n".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as reader:
        while chunk := reader.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == NO_ETC:
        return None
    if code != 0:
        raise HookError(f"{what} in {root} failed (exit {code})")
    return b"".join(chunks)


def _write_conf(name: str, folders: Sequence[str]) -> None:
    """In the chrooted child: /etc/ld.so.conf.d/NAME with one folder a line (the directory made when missing)."""
    os.makedirs("/etc/ld.so.conf.d", mode=0o755, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(f"/etc/ld.so.conf.d/{name}", flags, 0o644)
    try:
        os.fchmod(fd, 0o644)  # readable by a container running as another user
        os.write(fd, "".join(f"{f}\n" for f in folders).encode())
    finally:
        os.close(fd)


def _absolute(value: str, what: str) -> str:
    if not value.startswith("/") or "\n" in value or "\0" in value:
        raise HookError(f"{what} must be an absolute path, got {value[:100]!r}")
    return value


# ----- update-ldcache ----------------------------------------------------------------------------------------


def find_ldconfig() -> str:
    for candidate in LDCONFIG_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise HookError("ldconfig not found in " + ", ".join(LDCONFIG_CANDIDATES))


def _conf_and_compat_folders(folders: Sequence[str]) -> bytes:
    """In the chrooted child: write our loader configuration; return the folders the compat configurations name."""
    _write_conf(CONF_NAME, folders)
    compat: list[str] = []
    for name in sorted(os.listdir("/etc/ld.so.conf.d")):
        if COMPAT_CONF.fullmatch(name) and os.path.isfile(f"/etc/ld.so.conf.d/{name}"):
            with open(f"/etc/ld.so.conf.d/{name}", errors="replace") as f:
                compat += [line.strip() for line in f if line.strip().startswith("/")]
    return json.dumps(compat).encode()


def update_ldcache(state: Any, folders: Sequence[str], ldconfig: str | None = None) -> str:
    root = container_root(state)
    for folder in folders:
        _absolute(folder, "--folder")
    out = inside(root, "writing the loader configuration", lambda: _conf_and_compat_folders(folders))
    if out is None:
        return f"{root} has no /etc; ld.so cache left alone"
    compat = [f for f in json.loads(out) if f not in folders]
    exe = ldconfig or find_ldconfig()
    # -f and -C name the container's files explicitly: the host's ldconfig may be built with other defaults
    args = [exe, "-r", str(root), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache", *compat, *folders]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise HookError(f"{exe} -r {root} failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    return f"ld.so cache of {root} updated with {', '.join([*compat, *folders])}"


# ----- create-symlinks -------------------------------------------------------------------------------------


def parse_links(links: Sequence[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for spec in links:
        target, sep, link = spec.partition("::")
        if not sep or not target or "::" in link or "\0" in spec or "\n" in spec:
            raise HookError(f"--link: expected TARGET::LINK, got {spec[:100]!r}")
        out.append((target, _absolute(link, "--link's LINK")))
    return list(dict.fromkeys(out))


def _make_links(links: Sequence[tuple[str, str]]) -> bytes:
    """In the chrooted child: each LINK -> TARGET, through a temporary name and a rename (never half made)."""
    made = []
    for target, wanted in links:
        # the folder as the image resolves it (a dangling link in the image is made inside it, as the toolkit does)
        parent = os.path.realpath(os.path.dirname(wanted))
        link = os.path.join(parent, os.path.basename(wanted))
        try:
            if os.readlink(link) == target:
                continue
        except OSError:
            pass  # absent, or not a link: (re)made below
        os.makedirs(parent, mode=0o755, exist_ok=True)
        temporary = f"{link}.xpu-cdi-hook-{os.getpid()}"
        os.symlink(target, temporary)
        try:
            os.rename(temporary, link)
        except OSError:
            os.unlink(temporary)
            raise
        made.append(link)
    return json.dumps(made).encode()


def create_symlinks(state: Any, links: Sequence[str]) -> str:
    wanted = parse_links(links)
    root = container_root(state)
    out = inside(root, "creating symlinks", lambda: _make_links(wanted))
    if out is None:
        return f"{root} has no /etc; no symlinks made"
    return f"symlinks in {root}: {', '.join(json.loads(out)) or 'all there already'}"


# ----- enable-cuda-compat ----------------------------------------------------------------------------------


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``580.95.05`` -> (580, 95, 5); None for anything that is not dot-separated numbers."""
    parts = text.strip().split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def compat_note(data: bytes | mmap.mmap) -> dict[str, Any] | None:
    """The JSON of an ELF file's ``.note.cuda.fwd_compatibility`` note (owner "NVIDIA Corporation"), if it has one.

    Read as nvidia-cdi-hook reads it (cudacompat/cuda-elf-header.go): the section of type SHT_NOTE by that name, a
    note header of three 32-bit words in the file's byte order, the owner name padded to the section's alignment,
    then the description, JSON such as ``{"format":1,"CUDA version":"12.9","driver":[535,550,...],...}``."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    shoff, shentsize, shnum, shstrndx = (
        (*struct.unpack_from(order + "Q", data, 0x28), *struct.unpack_from(order + "HHH", data, 0x3A))
        if wide
        else (*struct.unpack_from(order + "I", data, 0x20), *struct.unpack_from(order + "HHH", data, 0x2E))
    )

    def section(index: int) -> tuple[int, int, int, int, int]:  # (name, type, offset, size, addralign)
        at = shoff + index * shentsize
        if wide:
            name, kind, _flags, _addr, offset, size, _link, _info, align, _entsize = struct.unpack_from(
                order + "IIQQQQIIQQ", data, at
            )
        else:
            name, kind, _flags, _addr, offset, size, _link, _info, align, _entsize = struct.unpack_from(
                order + "IIIIIIIIII", data, at
            )
        return name, kind, offset, size, align

    _, _, names_at, names_size, _ = section(shstrndx)
    names = data[names_at : names_at + names_size]
    for index in range(shnum):
        name, kind, offset, size, align = section(index)
        if kind != SHT_NOTE or names[name : names.find(b"\0", name)] != COMPAT_NOTE.encode():
            continue
        body = data[offset : offset + size]
        namesz, descsz, _ = struct.unpack_from(order + "III", body, 0)
        if not namesz or not descsz:
            return None
        step = max(align, 1)
        padded = (namesz + step - 1) // step * step
        if body[12 : 12 + namesz].rstrip(b"\0") != COMPAT_NOTE_OWNER:
            return None
        note = json.loads(body[12 + padded : 12 + padded + descsz].rstrip(b"\0"))
        return note if isinstance(note, dict) else None
    return None


def use_compat(compat_version: str, note: dict[str, Any] | None, host_version: str) -> bool:
    """nvidia-cdi-hook's rule (cudacompat.go, useCompatLibraries, with no host CUDA version given)."""
    compat, host = version_tuple(compat_version), version_tuple(host_version)
    if compat is None or host is None:
        return False
    if note is not None:
        branches = note.get("driver")
        return isinstance(branches, list) and host[0] in branches and compat > host
    return host[0] < compat[0]


def _compat_folder(compat_root: str, host_version: str) -> bytes:
    """In the chrooted child: the folder of the compat libcuda to use (resolved inside the image), or empty."""
    if not os.path.isdir(compat_root):
        return b""
    found = [
        entry
        for entry in sorted(os.scandir(compat_root), key=lambda e: e.name)
        if re.fullmatch(r"libcuda\.so\.[^.]+\..+", entry.name) and entry.is_file(follow_symlinks=False)
    ]
    if len(found) != 1:  # none, or several: no way to tell which (the toolkit leaves those alone too)
        return b""
    path = found[0].path
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            note = compat_note(data)
        except (ValueError, struct.error, IndexError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
    if not use_compat(found[0].name.removeprefix("libcuda.so."), note, host_version):
        return b""
    folder = os.path.dirname(os.path.realpath(path))
    _write_conf(COMPAT_CONF_NAME, [folder])
    return folder.encode()


def enable_cuda_compat(state: Any, host_version: str, compat_root: str = DEFAULT_COMPAT_ROOT) -> str:
    if version_tuple(host_version) is None:
        raise HookError(f"--host-driver-version: expected a version such as 580.95.05, got {host_version[:100]!r}")
    root = container_root(state)
    _absolute(compat_root, "--cuda-compat-container-root")
    out = inside(root, "looking for CUDA compat libraries", lambda: _compat_folder(compat_root, host_version))
    if not out:
        return f"{root}: no CUDA compat libraries newer than driver {host_version}; none used"
    return f"{root}: CUDA compat libraries of {out.decode()} used with driver {host_version}"


def partitions_asked(config: Any) -> list[str]:
    """The partition ids of the ``one-partition`` hooks in an OCI config (each partition's device adds one)."""
    hooks = config.get("hooks", {}).get("createContainer", []) if isinstance(config, dict) else []
    ids = set()
    for hook in hooks if isinstance(hooks, list) else []:
        args = hook.get("args") if isinstance(hook, dict) else None
        if isinstance(args, list) and ONE_PARTITION in args and "--partition" in args[:-1]:
            ids.add(str(args[args.index("--partition") + 1]))
    return sorted(ids)


def one_partition(state: Any, partition: str) -> str:
    _, config = container_config(state)
    asked = partitions_asked(config)
    if len(asked) > 1:
        raise HookError(
            f"this container asks for {len(asked)} partitions ({', '.join(asked)}): give a container one partition; "
            "each sets CUDA_VISIBLE_DEVICES (and a TDM one its MPS variables), so one would override the other's"
        )
    return f"partition {partition} is the container's only one"


# ----- command line ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpu-cdi-hook", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    upd = sub.add_parser("update-ldcache", help="add library folders to the container's ld.so cache")
    upd.add_argument("--folder", action="append", default=[], help="a folder of mounted libraries (repeatable)")
    upd.add_argument("--ldconfig", default=None, help="the host's ldconfig (default: found in /sbin, /usr/sbin)")
    links = sub.add_parser("create-symlinks", help="make symlinks inside the container")
    links.add_argument("--link", action="append", default=[], help="TARGET::LINK (repeatable)")
    compat = sub.add_parser("enable-cuda-compat", help="use the image's CUDA forward-compatibility libraries")
    compat.add_argument("--host-driver-version", required=True, help="the kernel module's version, e.g. 580.95.05")
    compat.add_argument("--cuda-compat-container-root", default=DEFAULT_COMPAT_ROOT, help="where they are")
    one = sub.add_parser(ONE_PARTITION, help="refuse a container given more than one partition")
    one.add_argument("--partition", required=True, help="the partition whose device runs this hook")
    args = parser.parse_args(argv)
    try:
        raw = sys.stdin.buffer.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise HookError("the OCI state on stdin is larger than 1 MiB")
        try:
            state = json.loads(raw)
        except ValueError as exc:
            raise HookError(f"the OCI state on stdin is not JSON: {exc}") from exc
        if args.command == "create-symlinks":
            message = create_symlinks(state, args.link)
        elif args.command == ONE_PARTITION:
            message = one_partition(state, args.partition)
        elif args.command == "enable-cuda-compat":
            message = enable_cuda_compat(state, args.host_driver_version, args.cuda_compat_container_root)
        else:
            message = update_ldcache(state, args.folder, args.ldconfig)
    except (HookError, OSError, subprocess.SubprocessError) as exc:
        print(f"xpu-cdi-hook: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("XPU_CDI_HOOK_VERBOSE"):
        print(f"xpu-cdi-hook: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
