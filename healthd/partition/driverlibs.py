"""The driver's user-space files a CUDA container needs, found on the node, as CDI mounts plus an ldcache hook.

A stock CUDA image carries the CUDA runtime but not the driver: ``cuInit`` needs ``libcuda.so.1`` and the libraries
it loads (the PTX JIT compiler, NVVM, ...), which must match the kernel module. nvidia-container-toolkit mounts them
from the host; this does the same for the compute and utility set that toolkit injects by default (its
libnvidia-container lists), found through the ld.so cache (``ldconfig -p``) like the toolkit does:

- each library is mounted read-only at the path the cache gives for its soname (``.../libcuda.so.1``), from the
  real file behind it (``.../libcuda.so.580.95.05``);
- when the driver version is known (``/proc/driver/nvidia/version``), only files of that version are taken, so a
  leftover library of an older driver is never handed out;
- the binaries (nvidia-smi, the MPS control and server, ...) go to ``/usr/bin`` in the container;
- a createContainer hook refreshes the container's ld.so cache for the library folders (see ``cdi_hook``), so
  images whose loader does not search the host's library directory still find them.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from healthd.partition.edits import ContainerEdits, Hook, Mount

log = structlog.get_logger("partition")

# libnvidia-container's utility_libs and compute_libs (NVIDIA_DRIVER_CAPABILITIES=compute,utility, its default).
LIBRARIES = (
    "libnvidia-ml.so",  # NVML
    "libnvidia-cfg.so",
    "libnvidia-nscq.so",  # NVSwitch topology
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-allocator.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nvvm.so",
    "libnvidia-tileiras.so",
)
# nvidia-ctk's driver binaries.
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
CONTAINER_BIN_DIR = "/usr/bin"
HOOK_SCRIPT = "xpu-cdi-hook"

# ``ldconfig -p`` prints the ABI in parentheses: "libcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1"
_LDCACHE_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")
_ABI_OF_MACHINE = {"x86_64": "x86-64", "aarch64": "AArch64"}
_NVRM_VERSION = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s")


@dataclass(frozen=True, slots=True)
class LdcacheEntry:
    soname: str
    abi: str
    path: str


@dataclass(frozen=True, slots=True)
class DriverFiles:
    libraries: tuple[Mount, ...]
    binaries: tuple[Mount, ...]
    skipped: tuple[str, ...]  # "<path>: why", for the log

    @property
    def folders(self) -> tuple[str, ...]:
        return tuple(sorted({str(Path(m.container_path).parent) for m in self.libraries}))


def parse_ldconfig(text: str) -> list[LdcacheEntry]:
    matches = (_LDCACHE_LINE.match(line) for line in text.splitlines())
    return [LdcacheEntry(m.group(1), m.group(2), m.group(3)) for m in matches if m]


def driver_version(proc_root: Path) -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version`` ("... Kernel Module ... 580.95.05 ...")."""
    try:
        text = (proc_root / "driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    m = _NVRM_VERSION.search(text)
    return m.group(1) if m else None


def _abi_matches(abi: str, machine: str) -> bool:
    wanted = _ABI_OF_MACHINE.get(machine)
    if wanted is None:  # another architecture: take whatever the cache lists first
        return True
    return wanted in (part.strip() for part in abi.split(","))


def find_libraries(
    entries: Sequence[LdcacheEntry],
    *,
    version: str | None,
    machine: str,
    realpath: Callable[[str], str] = os.path.realpath,
    names: Iterable[str] = LIBRARIES,
) -> tuple[list[Mount], list[str]]:
    mounts: list[Mount] = []
    skipped: list[str] = []
    taken: set[str] = set()
    for name in names:
        for e in entries:
            # the soname (libcuda.so.1), not the development link (libcuda.so)
            if not e.soname.startswith(name + ".") or not _abi_matches(e.abi, machine):
                continue
            target = realpath(e.path)
            if version is not None and not target.endswith(f".so.{version}"):
                skipped.append(f"{target}: not driver version {version}")
                continue
            container_path = str(Path(realpath(str(Path(e.path).parent))) / e.soname)
            if container_path in taken:
                continue
            taken.add(container_path)
            mounts.append(Mount(target, container_path, MOUNT_OPTIONS))
    return mounts, skipped


def find_binaries(dirs: Iterable[str] = BINARY_DIRS, names: Iterable[str] = BINARIES) -> list[Mount]:
    mounts = []
    for name in names:
        for d in dirs:
            candidate = Path(d) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                mounts.append(Mount(os.path.realpath(candidate), f"{CONTAINER_BIN_DIR}/{name}", MOUNT_OPTIONS))
                break
    return mounts


def read_ldcache(ldconfig: str | None = None, timeout: float = 10.0) -> str:
    """``ldconfig -p``: the host's ld.so cache, as the dynamic loader sees it."""
    exe = ldconfig or next((p for p in LDCONFIG_CANDIDATES if os.access(p, os.X_OK)), None)
    if exe is None:
        raise OSError("ldconfig not found in " + ", ".join(LDCONFIG_CANDIDATES))
    result = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise OSError(f"{exe} -p failed ({result.returncode}): {result.stderr.strip()[:200]}")
    return result.stdout


def discover(
    ldcache_text: str,
    *,
    proc_root: Path = Path("/proc"),
    machine: str | None = None,
    binary_dirs: Iterable[str] = BINARY_DIRS,
) -> DriverFiles:
    libraries, skipped = find_libraries(
        parse_ldconfig(ldcache_text), version=driver_version(proc_root), machine=machine or platform.machine()
    )
    binaries = find_binaries(binary_dirs) if libraries else []
    return DriverFiles(tuple(libraries), tuple(binaries), tuple(skipped))


def builtin_hook_path() -> str | None:
    """The ``xpu-cdi-hook`` installed next to this Python (the package's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / HOOK_SCRIPT
    if beside.is_file():
        return str(beside)
    found = shutil.which(HOOK_SCRIPT)
    return os.path.abspath(found) if found else None


def driver_edits(files: DriverFiles, hook_path: str | None) -> ContainerEdits | None:
    """Spec-level edits: the mounts, and the ldcache hook for the library folders (when the hook is installed)."""
    mounts = (*files.libraries, *files.binaries)
    if not mounts:
        return None
    hooks: tuple[Hook, ...] = ()
    if files.folders and hook_path is not None:
        args = [HOOK_SCRIPT, "update-ldcache"]
        for folder in files.folders:
            args += ["--folder", folder]
        hooks = (Hook("createContainer", hook_path, tuple(args)),)
    return ContainerEdits(mounts=mounts, hooks=hooks)


def discover_driver_edits(proc_root: Path = Path("/proc")) -> ContainerEdits | None:
    """Everything above on this node; logs what it found. None when the node has no driver libraries."""
    try:
        files = discover(read_ldcache(), proc_root=proc_root)
    except (OSError, subprocess.SubprocessError) as exc:
        log.error("cannot read the ld.so cache; CDI specs carry no driver libraries", error=str(exc))
        return None
    for why in files.skipped:
        log.warning("driver library skipped", why=why)
    hook = builtin_hook_path()
    edits = driver_edits(files, hook)
    if edits is None:
        log.warning("no NVIDIA driver libraries in the ld.so cache; CDI specs carry none")
        return None
    log.info(
        "CDI driver libraries",
        libraries=len(files.libraries),
        binaries=len(files.binaries),
        folders=list(files.folders),
        ldcache_hook=hook or "none (xpu-cdi-hook not installed)",
    )
    return edits
