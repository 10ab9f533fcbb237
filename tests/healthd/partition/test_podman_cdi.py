"""Real podman (Debian's 4.3.1, runtime runc) runs busybox containers with ``--device xpu-runtime-kit.io/gpu=<id>``
for a TDM and a MIG partition made by the partition manager on the simulated node, and a script inside lists what
the container got: the partition's environment, the driver-library and binary mounts (stand-in libraries built as
real ELF objects), the device nodes with their numbers (the MIG capability nodes exist nowhere on this host: the
runtime creates them from the spec) and the ld.so cache the ldcache hook built.

Podman 4.3.1 reads CDI specs only from /etc/cdi and /var/run/cdi (it has neither --cdi-spec-dir nor the
containers.conf cdi_spec_dirs key), so podman runs in a private mount namespace where a tmpfs over /run holds this
test's spec directory and podman's run-time state; nothing on the host is touched. Podman's storage lives in the
test's tmp dir. No AppArmor or SELinux profile (a fresh Debian 12 has AppArmor in the kernel but may lack
apparmor_parser), and rlimits no higher than this process has (podman's defaults fail without CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.host.devices import DeviceNode
from healthd.host.simulated_devices import gpu_instance_minor, simulated_host_devices, write_driver_tables
from healthd.partition.cdi import CdiWriter
from healthd.partition.cdi_cards import whole_card_devices
from healthd.partition.driverlibs import builtin_hook_path, discover, driver_edits
from healthd.partition.manager import CreateRequest, PartitionManager
from healthd.partition.model import CardMode, Owner, OwnerKind, PartitionRecord
from healthd.partition.mps import MpsSupervisor, SimulatedMpsControl
from healthd.partition.owners import OwnerProbe
from healthd.partition.store import Store
from tests.healthd.partition.standins import (
    LIBRARIES,
    VERSION,
    build_busybox_rootfs,
    build_driver_tree,
    write_driver_version,
)

TOOLS = ("podman", "runc", "unshare", "gcc")
PROBE = """\
echo "== env"; env
echo "== mounts"; cat /proc/self/mountinfo
echo "== devices"
find /dev -name 'nvidia*' | sort | while read -r n; do stat -c '%F|%t|%T|%a|%n' "$n"; done
echo "== ldcache"
for s in libcuda.so.1 libnvidia-ml.so.1 libnvidia-ptxjitcompiler.so.1 libnvidia-nvvm.so.4; do
  if grep -q "$s" /etc/ld.so.cache; then echo "$s"; fi
done
echo "== links"
find / -xdev -name 'lib*.so' -type l | while read -r l; do echo "$l $(readlink "$l")"; done
echo "== end"
"""
RUN_PODMAN = """\
set -e
run=$(readlink -f /var/run)
mount -t tmpfs -o mode=0755 tmpfs "$run"
mkdir "$run/cdi"
mount --bind "$CDI_DIR" "$run/cdi"
if [ -d /etc/cdi ]; then mount -t tmpfs tmpfs /etc/cdi; fi
set --
for d in $DEVICE; do set -- "$@" --device "xpu-runtime-kit.io/gpu=$d"; done
exec podman --root "$WORK/storage" --runroot "$run/podman" --tmpdir "$run/libpod" --storage-driver vfs \\
  --runtime runc --cgroup-manager cgroupfs --events-backend none \\
  run --rm --network none --security-opt apparmor=unconfined --security-opt label=disable \\
  --ulimit "nofile=$LIMIT:$LIMIT" --ulimit "nproc=$LIMIT:$LIMIT" \\
  "$@" --rootfs "$ROOTFS" /bin/sh /probe.sh
"""


def _cannot_run() -> str | None:
    """A reason to skip: only a kernel (or a non-root test run) that forbids the namespaces containers need."""
    if os.geteuid() != 0:
        return "rootful podman and a private mount namespace need root"
    result = subprocess.run(
        ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        return f"the kernel forbids the namespaces containers need: {result.stderr.strip()}"
    return None


@dataclass
class Setup:
    work: Path
    cdi_dir: Path
    rootfs: Path
    lib_dir: Path
    manager: PartitionManager
    tdm: PartitionRecord
    mig: PartitionRecord


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"not installed: {', '.join(missing)} (./dev test installs them)"
    if (reason := _cannot_run()) is not None:
        print(f"SKIP test_podman_cdi: {reason}")
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("podman")
    tree = build_driver_tree(work / "host")
    write_driver_version(work / "proc")
    files = discover(tree.ldconfig_text, proc_root=work / "proc", binary_dirs=[str(tree.bin_dir)])
    common = driver_edits(files, builtin_hook_path())
    assert common is not None
    assert common.hooks, "xpu-cdi-hook is not installed in this environment"
    backend = SimulatedBackend.from_name("h200x8")
    backend.open()
    write_driver_tables(work / "simulated-driver")
    devices = simulated_host_devices(work / "simulated-driver")
    cdi = CdiWriter(work / "cdi", common=common)
    manager = PartitionManager(
        backend,
        Store(work / "partitions.sqlite"),
        MpsSupervisor(SimulatedMpsControl(), work / "run"),
        cdi,
        OwnerProbe(cgroup_root=work / "cgroup", clock=lambda: 1_800_000_000.0),
        clock=lambda: 1_800_000_000.0,
        devices=devices,
        partition_hook=builtin_hook_path(),  # as the daemon does: each partition refuses a second one
    )
    cdi.include(lambda: whole_card_devices(manager.cards, manager.modes, devices))  # as the daemon does
    owner = Owner(OwnerKind.LEASE, holder="podman-test")

    async def make() -> tuple[PartitionRecord, PartitionRecord]:
        await manager.start()
        await manager.set_mode("3", CardMode.TDM)
        tdm = await manager.create(CreateRequest(owner=owner, gpu="3", compute_percent=30, memory_mib=2048))
        await manager.set_mode("6", CardMode.MIG)
        await manager.create(CreateRequest(owner=owner, gpu="6", compute_percent=10, memory_mib=0))
        mig = await manager.create(CreateRequest(owner=owner, gpu="6", compute_percent=10, memory_mib=0))
        return tdm, mig

    tdm, mig = asyncio.run(make())
    rootfs = build_busybox_rootfs(work / "rootfs")
    (rootfs / "probe.sh").write_text(PROBE)
    return Setup(work, work / "cdi", rootfs, tree.lib_dir, manager, tdm, mig)


@dataclass
class Seen:
    env: dict[str, str]
    mounts: dict[str, str]  # mount point -> per-mount options
    devices: dict[str, tuple[str, int, int, int]]  # path -> (kind, major, minor, mode)
    ldcache: list[str]
    links: dict[str, str]  # development link -> its target


def podman(s: Setup, device: str) -> subprocess.CompletedProcess[str]:
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = 4096 if limit == resource.RLIM_INFINITY else min(limit, 4096)  # never above the hard limit we have
    env = {
        **os.environ,
        "CDI_DIR": str(s.cdi_dir),
        "WORK": str(s.work / "podman"),
        "ROOTFS": str(s.rootfs),
        "DEVICE": device,
        "LIMIT": str(limit),
    }
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", RUN_PODMAN],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def run_in_container(s: Setup, device: str) -> Seen:
    result = podman(s, device)
    assert result.returncode == 0, f"podman failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr}"
    sections: dict[str, list[str]] = {}
    current = ""
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:]
            sections[current] = []
        elif current:
            sections[current].append(line)
    assert "end" in sections, result.stdout
    mounts = {}
    for line in sections["mounts"]:
        fields = line.split()
        mounts[fields[4]] = fields[5]
    devices = {}
    for line in sections["devices"]:
        kind, major, minor, mode, path = line.split("|")
        devices[path] = (kind, int(major, 16), int(minor, 16), int(mode, 8))
    env_in = dict(line.split("=", 1) for line in sections["env"] if "=" in line)
    links = dict(line.split(" ", 1) for line in sections["links"])
    return Seen(env_in, mounts, devices, sections["ldcache"], links)


def expected_devices(nodes: tuple[DeviceNode, ...]) -> dict[str, tuple[str, int, int, int]]:
    out = {}
    for n in nodes:
        assert isinstance(n, DeviceNode)
        assert n.major is not None and n.minor is not None and n.file_mode is not None
        out[n.path] = ("character special file", n.major, n.minor, n.file_mode)
    return out


def check_driver_files(s: Setup, seen: Seen) -> None:
    for soname in LIBRARIES:
        options = seen.mounts[str(s.lib_dir / soname)]
        assert "ro" in options.split(","), (soname, options)
    for name in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        assert "ro" in seen.mounts[f"/usr/bin/{name}"].split(",")
    # the createContainer hook rebuilt the container's ld.so cache with the stand-in libraries
    assert seen.ldcache == ["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"]
    # the create-symlinks hook made the development links, libcuda.so first among them
    assert seen.links[str(s.lib_dir / "libcuda.so")] == "libcuda.so.1"
    assert seen.links[str(s.lib_dir / "libnvidia-ml.so")] == "libnvidia-ml.so.1"
    assert VERSION in next(iter(LIBRARIES.values()))


def test_spec_is_what_debian_podman_loads(setup: Setup) -> None:
    spec = json.loads((setup.cdi_dir / "xpu-runtime-kit.io-gpu.json").read_text())
    assert spec["cdiVersion"] == "0.3.0"
    assert {setup.tdm.id, setup.mig.id} <= {d["name"] for d in spec["devices"]}
    # the first MIG partition (made so the tested one is not GPU instance 1), and the six cards in mode none
    assert len(spec["devices"]) == 3 + 6


def test_tdm_partition_in_a_container(setup: Setup) -> None:
    seen = run_in_container(setup, setup.tdm.id)
    edits = setup.manager.edits(setup.tdm)
    for key, value in edits.env.items():
        assert seen.env.get(key) == value, key
    assert seen.env["CUDA_VISIBLE_DEVICES"] == setup.tdm.gpu_uuid
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    pipe = edits.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe in seen.mounts  # the MPS pipe directory of this partition
    assert seen.devices == {
        "/dev/nvidiactl": ("character special file", 195, 255, 0o666),
        "/dev/nvidia-uvm": ("character special file", 238, 0, 0o666),
        "/dev/nvidia-uvm-tools": ("character special file", 238, 1, 0o666),
        "/dev/nvidia3": ("character special file", 195, 3, 0o666),
    }
    assert seen.devices == expected_devices(edits.device_nodes)
    check_driver_files(setup, seen)


def test_mig_partition_in_a_container(setup: Setup) -> None:
    seen = run_in_container(setup, setup.mig.id)
    assert setup.mig.mig is not None
    assert seen.env["CUDA_VISIBLE_DEVICES"] == setup.mig.mig.uuid
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void"  # a legacy nvidia-container-runtime adds nothing more
    assert "CUDA_MPS_PIPE_DIRECTORY" not in seen.env
    gi, ci = setup.mig.mig.gpu_instance_id, setup.mig.mig.compute_instance_id
    gi_minor = gpu_instance_minor(6, gi)  # numbered like the kernel module: 3 + 135 * gpu + 9 * gi
    caps = {
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}": ("character special file", 241, gi_minor, 0o444),
        f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + ci}": ("character special file", 241, gi_minor + 1 + ci, 0o444),
    }
    assert {p: d for p, d in seen.devices.items() if "nvidia-caps/" in p} == caps
    assert seen.devices["/dev/nvidia6"] == ("character special file", 195, 6, 0o666)
    assert seen.devices["/dev/nvidia-caps"][0] == "directory"
    assert {p: d for p, d in seen.devices.items() if p != "/dev/nvidia-caps"} == expected_devices(
        setup.manager.edits(setup.mig).device_nodes
    )
    assert not any(Path(p).exists() for p in caps)  # nothing on the host: podman made them from the spec
    check_driver_files(setup, seen)


def test_a_whole_card_in_mode_none_in_a_container(setup: Setup) -> None:
    info = setup.manager.cards[0]
    seen = run_in_container(setup, info.uuid)
    assert seen.devices["/dev/nvidia0"] == ("character special file", 195, 0, 0o666)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in seen.env


@pytest.mark.parametrize("gpu", [3, 6], ids=["tdm", "mig"])
def test_a_partitioned_card_cannot_be_had_whole(setup: Setup, gpu: int) -> None:
    """A whole-card device for a TDM card would bypass every quota on it; for a MIG card, every instance."""
    result = podman(setup, setup.manager.cards[gpu].uuid)
    assert result.returncode != 0
    assert "unresolvable CDI devices" in result.stderr, result.stderr
    assert setup.manager.cards[gpu].uuid in result.stderr


def test_two_partitions_in_one_container_are_refused(setup: Setup) -> None:
    """Both would set CUDA_VISIBLE_DEVICES, and the TDM one its MPS variables: one partition's hook refuses."""
    result = podman(setup, f"{setup.tdm.id} {setup.mig.id}")
    assert result.returncode != 0
    assert f"asks for 2 partitions ({', '.join(sorted([setup.tdm.id, setup.mig.id]))})" in result.stderr, result.stderr
    assert "give a container one partition" in result.stderr
