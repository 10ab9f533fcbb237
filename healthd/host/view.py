"""The host view: where the node's own files are, chosen once, beside the backend, for a real or a simulated node.

Every part that reads the node outside the driver (processes in /proc, PCI devices in /sys, the kernel log,
kubelet's pod-resources socket, container cgroups, the CDI directory, the driver's device tables, the MPS binaries)
takes its paths from here. On a real node they are the ``[host]`` settings. On a simulated node they are files the
simulator writes under the state directory (a proc tree and kubelet for its processes and pods, a sysfs tree of its
PCIe layout, the driver's device tables), so the real readers run unchanged over simulated data, and the host's
own /proc and /sys, which describe the machine the simulator runs on, are never mistaken for the simulated GPUs.
Choosing writes nothing: the simulation component (healthd/sim/component.py) writes those files when it starts, first
of all components.

This module is the one place that asks whether the backend is simulated.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.settings import option
from healthd.host.devices import HostDevices
from healthd.host.simulated_devices import simulated_host_devices

DEFAULT_KMSG = Path("/dev/kmsg")
SYSTEM_CDI_DIR = Path("/var/run/cdi")


@dataclass(frozen=True, slots=True)
class HostSettings:
    """[host]: where the node's files are (a container that mounts the host's elsewhere changes these)."""

    proc_root: Path = option(Path("/proc"), absolute=True)
    sysfs_root: Path = option(Path("/sys"), absolute=True)
    kmsg_path: Path | None = option(DEFAULT_KMSG, absolute=True)  # "": no kernel-log source (NVML events remain)
    kubelet_socket: Path = option(Path("/var/lib/kubelet/pod-resources/kubelet.sock"), absolute=True)
    pod_logs_root: Path = option(Path("/var/log"), absolute=True)  # kubelet's pods/ and containers/ log directories
    cgroup_root: Path = option(Path("/sys/fs/cgroup"), absolute=True)
    cdi_dir: Path | None = option(None, absolute=True)  # unset: /var/run/cdi; <state_dir>/cdi on a simulated node
    # MPS control daemons: auto is the NVIDIA binary on real GPUs and an in-process stand-in on a simulated node
    mps_control: str = option("auto", choices=("auto", "nvidia", "simulated"))
    # simulated node only: serve a simulated kubelet pod-resources socket (true), or use kubelet_socket (a real
    # kubelet, or a test double beside the simulated GPUs)
    simulate_kubelet: bool = True


@dataclass(frozen=True, slots=True)
class ProbeHost:
    """What a probe may read of the node besides Snapshots; None where nothing real is there (a simulated node)."""

    proc_root: Path | None = None
    sysfs_root: Path | None = None
    state_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class SimulatedFiles:
    """Where the simulator writes the node around its GPUs (a simulated node only)."""

    node_root: Path  # proc tree, kubelet log directories and the pod-resources socket (healthd/sim/node.py)
    sysfs_root: Path  # the scenario's PCIe layout (an empty tree when it has none)
    driver_root: Path  # the driver's device tables (healthd/host/simulated_devices.py)
    mig_state: Path  # the simulated driver's MIG instances, kept across daemon restarts (healthd/sim/mig_state.py)
    serve_kubelet: bool  # serve a simulated pod-resources socket (false: a real kubelet or a test double answers)


@dataclass(frozen=True, slots=True)
class HostView:
    proc_root: Path
    sysfs_root: Path
    kmsg_path: Path | None
    kubelet_socket: Path
    pod_logs_root: Path
    cgroup_root: Path
    cdi_dir: Path
    devices: HostDevices  # the driver's device tables (/proc/devices, nvidia-caps minors) for CDI device nodes
    mps_control: str  # "nvidia" or "simulated"
    driver_libraries: bool  # whether the driver's user-space libraries can be looked for (never on a simulated node)
    probes: ProbeHost  # what the health probes read
    simulated: SimulatedFiles | None = None  # None on a real node


def choose_host(settings: HostSettings, backend: Backend, state_dir: Path) -> HostView:
    if isinstance(backend, SimulatedBackend):
        return simulated_host(settings, state_dir)
    return real_host(settings, state_dir)


def real_host(settings: HostSettings, state_dir: Path) -> HostView:
    return HostView(
        proc_root=settings.proc_root,
        sysfs_root=settings.sysfs_root,
        kmsg_path=settings.kmsg_path,
        kubelet_socket=settings.kubelet_socket,
        pod_logs_root=settings.pod_logs_root,
        cgroup_root=settings.cgroup_root,
        cdi_dir=settings.cdi_dir or SYSTEM_CDI_DIR,
        devices=HostDevices(settings.proc_root),
        mps_control="simulated" if settings.mps_control == "simulated" else "nvidia",
        driver_libraries=True,
        probes=ProbeHost(proc_root=settings.proc_root, sysfs_root=settings.sysfs_root, state_dir=state_dir),
    )


def simulated_host(settings: HostSettings, state_dir: Path) -> HostView:
    """The files around the simulated GPUs, under ``state_dir``; real paths only where a setting says so."""
    files = SimulatedFiles(
        node_root=state_dir / "sim-node",
        sysfs_root=state_dir / "simulated-sysfs",
        driver_root=state_dir / "simulated-driver",
        mig_state=state_dir / "simulated-mig.json",
        serve_kubelet=settings.simulate_kubelet,
    )
    return HostView(
        proc_root=files.node_root / "proc",
        sysfs_root=files.sysfs_root,
        # the host's kernel log is not the simulated GPUs'; a kmsg file given explicitly is read (tests feed lines)
        kmsg_path=None if settings.kmsg_path == DEFAULT_KMSG else settings.kmsg_path,
        kubelet_socket=kubelet_socket_path(files.node_root) if files.serve_kubelet else settings.kubelet_socket,
        pod_logs_root=files.node_root / "log",
        cgroup_root=settings.cgroup_root,
        cdi_dir=settings.cdi_dir or state_dir / "cdi",
        devices=simulated_host_devices(files.driver_root),
        mps_control="nvidia" if settings.mps_control == "nvidia" else "simulated",
        driver_libraries=False,
        probes=ProbeHost(proc_root=None, sysfs_root=None, state_dir=state_dir),
        simulated=files,
    )


UNIX_PATH_MAX = 107  # sun_path holds 108 bytes including the terminating NUL


def kubelet_socket_path(root: Path) -> Path:
    """``<root>/kubelet/kubelet.sock``, or a short path under /tmp keyed by ``root`` when that one is too long for
    a unix socket (deep state directories, e.g. under pytest's tmp)."""
    path = root / "kubelet" / "kubelet.sock"
    if len(str(path)) <= UNIX_PATH_MAX:
        return path
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"xpu-sim-kubelet-{digest}" / "kubelet.sock"
