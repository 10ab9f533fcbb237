"""The NVIDIA device nodes a container needs, with type, major, minor and mode, as CDI deviceNodes.

A CDI deviceNode that names only a path makes the container runtime stat that node on the host ("failed to stat
CDI host device" when it is missing). The driver creates ``/dev/nvidia<N>`` and ``/dev/nvidiactl`` itself, but
of ``/dev/nvidia-caps`` it creates only the MIG config and monitor nodes; the nodes that grant access to one GPU
instance and one compute instance are made by whoever hands the instance out. So every node here carries its
numbers, and the runtime creates it inside the container:

- majors from the ``Character devices`` section of ``/proc/devices``: ``nvidia`` (drivers before 545 call it
  ``nvidia-frontend``; the major is 195 either way), ``nvidia-uvm`` and ``nvidia-caps`` (both dynamic);
- the control node is minor 255 of the nvidia major, a card is minor ``<card minor>``, ``nvidia-uvm-tools`` is
  minor 1 of the uvm major;
- MIG capability minors from ``/proc/driver/nvidia-caps/mig-minors``, lines ``<capability> <minor>`` such as
  ``gpu0/gi1/access 12`` and ``gpu0/gi1/ci0/access 13``;
- the mode of a node that exists on the host from the node itself; otherwise 0666 for the nvidia nodes (the
  driver's default device file mode) and, for a MIG capability, the ``DeviceFileMode`` the driver publishes in
  ``/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access`` (0444 when that file is absent).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("partition")

NVIDIA_MAJOR_NAMES = ("nvidia", "nvidia-frontend")  # renamed from nvidia-frontend in driver 545
UVM_NAME = "nvidia-uvm"
CAPS_NAME = "nvidia-caps"
CONTROL_MINOR = 255
UVM_TOOLS_MINOR = 1
DEFAULT_NODE_MODE = 0o666  # NVreg_DeviceFileMode's default
DEFAULT_CAP_MODE = 0o444
TABLE_TTL_SECONDS = 10.0  # the tables change only when the driver is reloaded


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A CDI deviceNode. ``major is None`` means path only: the runtime stats the host node."""

    path: str
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    type: str = "c"


def parse_proc_devices(text: str) -> dict[str, int]:
    """Name -> major of the character devices in ``/proc/devices`` (the block section is ignored)."""
    majors: dict[str, int] = {}
    in_char = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            in_char = line == "Character devices:"
            continue
        number, _, name = line.partition(" ")
        if in_char and name and number.isascii() and number.isdigit():
            majors.setdefault(name.strip(), int(number))
    return majors


def parse_mig_minors(text: str) -> dict[str, int]:
    """Capability -> minor from ``/proc/driver/nvidia-caps/mig-minors``; malformed lines are skipped."""
    minors: dict[str, int] = {}
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def gpu_instance_cap(gpu_minor: int, gi: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/access"


def compute_instance_cap(gpu_minor: int, gi: int, ci: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"


def cap_device_path(minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


@dataclass(frozen=True, slots=True)
class DriverTables:
    majors: dict[str, int]
    mig_minors: dict[str, int]

    def nvidia_major(self) -> int | None:
        for name in NVIDIA_MAJOR_NAMES:
            if name in self.majors:
                return self.majors[name]
        return None


class HostDevices:
    """The driver's device numbers (``<proc_root>``) and the host's nodes (``<dev_root>``), for CDI specs.

    The parsed tables are kept for a few seconds, so writing a spec with many partitions reads them once.
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        dev_root: Path = Path("/dev"),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.dev_root = dev_root
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: tuple[float, DriverTables] | None = None
        self._nodes: dict[str, DeviceNode] = {}  # resolved nodes, valid as long as the tables
        self._warned: set[str] = set()

    def tables(self) -> DriverTables:
        with self._lock:
            now = self._clock()
            if self._tables is None or now - self._tables[0] > TABLE_TTL_SECONDS:
                tables = DriverTables(
                    parse_proc_devices(self._read("devices")),
                    parse_mig_minors(self._read("driver/nvidia-caps/mig-minors")),
                )
                self._tables = (now, tables)
                self._nodes = {}
            return self._tables[1]

    def card_nodes(self, gpu_minor: int) -> tuple[DeviceNode, ...]:
        """What CUDA opens for a whole card or an MPS client: control, UVM, UVM tools (when known), the card."""
        t = self.tables()
        nvidia, uvm = t.nvidia_major(), t.majors.get(UVM_NAME)
        nodes = [
            self._node("/dev/nvidiactl", nvidia, CONTROL_MINOR, DEFAULT_NODE_MODE),
            self._node("/dev/nvidia-uvm", uvm, 0, DEFAULT_NODE_MODE),
        ]
        tools = self._node("/dev/nvidia-uvm-tools", uvm, UVM_TOOLS_MINOR, DEFAULT_NODE_MODE)
        if tools.major is not None:  # profilers only; without numbers it would make the runtime fail
            nodes.append(tools)
        nodes.append(self._node(f"/dev/nvidia{gpu_minor}", nvidia, gpu_minor, DEFAULT_NODE_MODE))
        return tuple(nodes)

    def mig_nodes(self, gpu_minor: int, gi: int, ci: int) -> tuple[DeviceNode, ...]:
        """The card's nodes plus the capability nodes of GPU instance ``gi`` and its compute instance ``ci``."""
        t = self.tables()
        caps_major = t.majors.get(CAPS_NAME)
        nodes = list(self.card_nodes(gpu_minor))
        for cap in (gpu_instance_cap(gpu_minor, gi), compute_instance_cap(gpu_minor, gi, ci)):
            minor = t.mig_minors.get(cap)
            if minor is None:
                self._warn_once(cap, "MIG capability not in mig-minors; the container cannot open the instance")
                continue
            nodes.append(self._node(cap_device_path(minor), caps_major, minor, None, cap))
        return tuple(nodes)

    def _node(self, path: str, major: int | None, minor: int, default_mode: int | None, cap: str = "") -> DeviceNode:
        """The node at ``path`` (its numbers follow from the tables, so it is kept as long as they are)."""
        node = self._nodes.get(path)
        if node is None:
            node = self._resolve(path, major, minor, default_mode, cap)
            self._nodes[path] = node
        return node

    def _resolve(self, path: str, major: int | None, minor: int, default_mode: int | None, cap: str) -> DeviceNode:
        host = self.dev_root / path.removeprefix("/dev/")
        try:
            st = host.stat()
        except OSError:
            st = None
        if st is not None and stat.S_ISCHR(st.st_mode):
            return DeviceNode(path, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))
        if major is None:
            self._warn_once(path, "no major number for this device in /proc/devices; listed by path only")
            return DeviceNode(path)
        return DeviceNode(path, major, minor, default_mode if default_mode is not None else self._cap_mode(cap))

    def _cap_mode(self, cap: str) -> int:
        gpu, _, rest = cap.partition("/")
        text = self._read(f"driver/nvidia/capabilities/{gpu}/mig/{rest}")
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMode" and value.strip().isascii() and value.strip().isdigit():
                return int(value.strip()) & 0o777
        return DEFAULT_CAP_MODE

    def _read(self, relative: str) -> str:
        try:
            return (self.proc_root / relative).read_text(errors="replace")
        except OSError:
            return ""

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, device=key, proc_root=str(self.proc_root))
