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
- createContainer hooks (``cdi_hook``), in nvidia-container-toolkit's order (pkg/nvcdi/driver-nvml.go): the
  development links (``libcuda.so -> libcuda.so.1`` always, as the toolkit makes it; ``libX.so -> libX.so.N``
  where the host has that link too, internal/discover/symlinks.go), CUDA forward compatibility for images newer
  than the driver (``--host-driver-version``), and the container's ld.so cache for the library folders, so images
  whose loader does not search the host's library directory still find them.
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
    links: tuple[tuple[str, str], ...] = ()  # (target, link) development links to make in the container
    driver_version: str | None = None  # the kernel module's, for the forward-compatibility check

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


def development_links(
    libraries: Iterable[Mount], exists: Callable[[str], bool] = os.path.lexists
) -> list[tuple[str, str]]:
    """(target, link): ``libX.so -> <soname>`` beside each mounted library whose host folder has that link, and
    ``libcuda.so -> libcuda.so.1`` whatever the host has (the toolkit's rule: applications dlopen "libcuda.so")."""
    links = []
    for mount in libraries:
        soname = Path(mount.container_path).name
        dev_name = soname.split(".so.", 1)[0] + ".so"
        if dev_name == "libcuda.so" or exists(str(Path(mount.host_path).parent / dev_name)):
            links.append((soname, str(Path(mount.container_path).parent / dev_name)))
    return list(dict.fromkeys(links))


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
    version = driver_version(proc_root)
    libraries, skipped = find_libraries(
        parse_ldconfig(ldcache_text), version=version, machine=machine or platform.machine()
    )
    if not libraries:
        return DriverFiles((), (), tuple(skipped))
    return DriverFiles(
        tuple(libraries),
        tuple(find_binaries(binary_dirs)),
        tuple(skipped),
        links=tuple(development_links(libraries)),
        driver_version=version,
    )


def builtin_hook_path() -> str | None:
    """The ``xpu-cdi-hook`` installed next to this Python (the package's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / HOOK_SCRIPT
    if beside.is_file():
        return str(beside)
    found = shutil.which(HOOK_SCRIPT)
    return os.path.abspath(found) if found else None


def driver_hooks(files: DriverFiles, hook_path: str) -> tuple[Hook, ...]:
    """create-symlinks, enable-cuda-compat, update-ldcache: what nvidia-ctk's specs run, in its order."""
    hooks = []
    if files.links:
        args = [HOOK_SCRIPT, "create-symlinks"]
        for target, link in files.links:
            args += ["--link", f"{target}::{link}"]
        hooks.append(Hook("createContainer", hook_path, tuple(args)))
    if files.driver_version is not None:
        args = [HOOK_SCRIPT, "enable-cuda-compat", "--host-driver-version", files.driver_version]
        hooks.append(Hook("createContainer", hook_path, tuple(args)))
    if files.folders:
        args = [HOOK_SCRIPT, "update-ldcache"]
        for folder in files.folders:
            args += ["--folder", folder]
        hooks.append(Hook("createContainer", hook_path, tuple(args)))
    return tuple(hooks)


def driver_edits(files: DriverFiles, hook_path: str | None) -> ContainerEdits | None:
    """Spec-level edits: the mounts, and the hooks that complete them (when the hook script is installed)."""
    mounts = (*files.libraries, *files.binaries)
    if not mounts:
        return None
    return ContainerEdits(mounts=mounts, hooks=driver_hooks(files, hook_path) if hook_path is not None else ())


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
        links=len(files.links),
        driver_version=files.driver_version or "unknown (no forward-compatibility check)",
        hooks=hook or "none (xpu-cdi-hook not installed)",
    )
    return edits
