"""The host view: where the node's own files are, chosen once, beside the backend, for a real or a simulated node.

Every part that reads the node outside the driver (processes in /proc, PCI devices in /sys, the kernel log,
kubelet's pod-resources socket, container cgroups, the CDI directory, the driver's device tables, the MPS binaries)
takes its paths from here. On a real node they are the ``[host]`` settings. On a simulated node they are files the
simulator writes under the state directory (a proc tree and kubelet for its processes and pods, a sysfs tree of its
PCIe layout, the driver's device tables), so the real readers run unchanged over simulated data, and the host's
own /proc and /sys, which describe the machine the simulator runs on, are never mistaken for the simulated GPUs.

This module is the one place that asks whether the backend is simulated.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.backends.protocol import Backend
from exporter.backends.simulated import SimulatedBackend
from exporter.settings import option
from exporter.snapshot import Snapshot
from exporter.topology.layout import simulated_sysfs
from healthd.host.devices import HostDevices
from healthd.host.simulated_devices import simulated_host_devices
from healthd.probes.base import ProbeHost
from healthd.sim.node import SimulatedNode

log = structlog.get_logger("host")

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
    node: SimulatedNode | None = None  # the simulated processes and kubelet; None on a real node

    def start(self) -> None:
        if self.node is not None:
            self.node.start()

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()

    def sync(self, snapshot: Snapshot) -> None:
        """Keep the simulated proc tree and kubelet in step with the simulated processes (no-op on a real node)."""
        if self.node is not None:
            self.node.sync(snapshot)


def choose_host(settings: HostSettings, backend: Backend, state_dir: Path) -> HostView:
    if isinstance(backend, SimulatedBackend):
        return simulated_host(settings, backend, state_dir)
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


def simulated_host(settings: HostSettings, backend: SimulatedBackend, state_dir: Path) -> HostView:
    """The files around the simulated GPUs, under ``state_dir``; real paths only where a setting says so."""
    node = SimulatedNode(backend, state_dir / "sim-node", serve_kubelet=settings.simulate_kubelet)
    scenario = backend.scenario
    sysfs = state_dir / "simulated-sysfs"
    tree = simulated_sysfs(scenario.extra, [c.pci_bus_id for c in scenario.cards], sysfs)
    if tree is None:  # no [topology] in the scenario: an empty tree, never the host's /sys with fake GPUs
        shutil.rmtree(sysfs, ignore_errors=True)
        sysfs.mkdir(parents=True)
        tree = sysfs
    log.info("simulated node", files=str(state_dir), sysfs_root=str(tree))
    return HostView(
        proc_root=node.proc_root,
        sysfs_root=tree,
        # the host's kernel log is not the simulated GPUs'; a kmsg file given explicitly is read (tests feed lines)
        kmsg_path=None if settings.kmsg_path == DEFAULT_KMSG else settings.kmsg_path,
        kubelet_socket=node.kubelet.socket_path if settings.simulate_kubelet else settings.kubelet_socket,
        pod_logs_root=node.log_root,
        cgroup_root=settings.cgroup_root,
        cdi_dir=settings.cdi_dir or state_dir / "cdi",
        devices=simulated_host_devices(state_dir / "simulated-driver"),
        mps_control="nvidia" if settings.mps_control == "nvidia" else "simulated",
        driver_libraries=False,
        probes=ProbeHost(proc_root=None, sysfs_root=None, state_dir=state_dir),
        node=node,
    )
