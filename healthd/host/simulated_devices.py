"""Simulation only: the driver's device tables of a real node, so the simulated daemon's CDI specs carry
real-looking device numbers through the same reader (``HostDevices``) a real node uses.

Under ``<root>``: ``proc/devices`` and ``proc/driver/nvidia-caps/mig-minors`` as the NVIDIA driver (580) prints
them, and an empty ``dev/`` (no host nodes: every number comes from the tables, as on a node where the MIG
capability nodes were never created).

- Majors: 195 for ``nvidia``/``nvidiactl`` (fixed by the driver); ``nvidia-uvm`` 238 and ``nvidia-caps`` 241 as
  measured on a real H200 node with driver 580 (both are dynamic on real nodes).
- ``mig-minors``: the kernel module numbers its capabilities from one static table at load time (open-gpu-kernel-
  modules, ``nv-caps.c``): minor 0 is the NVLink fabric-management capability (listed in ``nvlink-minors``), 1 and
  2 are MIG ``config`` and ``monitor``, then for each of 32 possible GPUs and each of 15 GPU instances come the GI
  ``access`` capability followed by its 8 compute-instance ``access`` capabilities. So ``gpu0/gi0/access`` is 3,
  ``gpu0/gi1/access`` 12, ``gpu0/gi1/ci0/access`` 13, and the file lists every entry whether or not the GPU exists.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from healthd.host.devices import HostDevices

MAX_GPUS = 32
GPU_INSTANCES = 15
COMPUTE_INSTANCES = 8
FIRST_GPU_MINOR = 3  # after fabric-mgmt (0), config (1), monitor (2)

PROC_DEVICES = """\
Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
  7 vcs
 10 misc
 13 input
 21 sg
 29 fb
128 ptm
136 pts
180 usb
189 usb_device
195 nvidia
195 nvidiactl
226 drm
238 nvidia-uvm
241 nvidia-caps

Block devices:
  7 loop
  8 sd
  9 md
 11 sr
 65 sd
259 blkext
"""


def gpu_instance_minor(gpu: int, gi: int) -> int:
    return FIRST_GPU_MINOR + gpu * GPU_INSTANCES * (1 + COMPUTE_INSTANCES) + gi * (1 + COMPUTE_INSTANCES)


def mig_minors_text() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(MAX_GPUS):
        for gi in range(GPU_INSTANCES):
            base = gpu_instance_minor(gpu, gi)
            lines.append(f"gpu{gpu}/gi{gi}/access {base}")
            lines.extend(f"gpu{gpu}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(COMPUTE_INSTANCES))
    return "\n".join(lines) + "\n"


def simulated_host_devices(root: Path) -> HostDevices:
    """A reader of the tables under ``root`` (``write_driver_tables`` puts them there)."""
    return HostDevices(root / "proc", root / "dev")


def write_driver_tables(root: Path) -> None:
    """Write the tables under ``root``, replacing an earlier run's."""
    if root.exists():
        shutil.rmtree(root)
    proc = root / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (root / "dev").mkdir()
    (proc / "devices").write_text(PROC_DEVICES)
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text(mig_minors_text())
