"""Device nodes for CDI: majors from /proc/devices, MIG capability minors from mig-minors, modes, host nodes, and
the simulated node's tables (numbered like the NVIDIA kernel module numbers them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from healthd.host.devices import DeviceNode, HostDevices, parse_mig_minors, parse_proc_devices
from healthd.host.simulated_devices import (
    PROC_DEVICES,
    mig_minors_text,
    simulated_host_devices,
    write_driver_tables,
)

# /proc/devices modelled on driver 580 (majors of the H200 node) and on drivers before 545 (nvidia-frontend)
DEVICES_580 = """Character devices:
  1 mem
195 nvidia
195 nvidiactl
238 nvidia-uvm
241 nvidia-caps

Block devices:
  8 sd
242 nvidia-caps-not-a-char
"""
DEVICES_535 = """Character devices:
195 nvidia-frontend
195 nvidia-modeset
509 nvidia-uvm
510 nvidia-caps
Block devices:
259 blkext
"""


def proc_tree(root: Path, devices: str, mig_minors: str | None) -> Path:
    proc = root / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(devices)
    if mig_minors is not None:
        (proc / "driver" / "nvidia-caps" / "mig-minors").write_text(mig_minors)
    (root / "dev").mkdir()
    return proc


def test_proc_devices_reads_only_character_devices() -> None:
    majors = parse_proc_devices(DEVICES_580)
    assert majors == {"mem": 1, "nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238, "nvidia-caps": 241}
    assert parse_proc_devices("garbage\n  x y\n٣ nvidia\n") == {}


def test_mig_minors_parsing_skips_malformed_lines() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbroken\ngpu0/gi2/access x\n"
    assert parse_mig_minors(text) == {"config": 1, "monitor": 2, "gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13}


def test_card_nodes_carry_numbers_from_proc_devices(tmp_path: Path) -> None:
    devices = HostDevices(proc_tree(tmp_path, DEVICES_580, None), tmp_path / "dev")
    assert devices.card_nodes(3) == (
        DeviceNode("/dev/nvidiactl", 195, 255, 0o666),
        DeviceNode("/dev/nvidia-uvm", 238, 0, 0o666),
        DeviceNode("/dev/nvidia-uvm-tools", 238, 1, 0o666),
        DeviceNode("/dev/nvidia3", 195, 3, 0o666),
    )


def test_older_drivers_name_the_major_nvidia_frontend(tmp_path: Path) -> None:
    devices = HostDevices(proc_tree(tmp_path, DEVICES_535, None), tmp_path / "dev")
    nodes = {n.path: n for n in devices.card_nodes(0)}
    assert (nodes["/dev/nvidia0"].major, nodes["/dev/nvidiactl"].major) == (195, 195)
    assert nodes["/dev/nvidia-uvm"].major == 509


def test_without_uvm_the_tools_node_is_left_out_and_uvm_is_path_only(tmp_path: Path) -> None:
    devices = HostDevices(proc_tree(tmp_path, "Character devices:\n195 nvidia\n", None), tmp_path / "dev")
    nodes = devices.card_nodes(1)
    assert [n.path for n in nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]
    assert nodes[1] == DeviceNode("/dev/nvidia-uvm")  # unknown numbers: the runtime must stat the host node


def test_a_host_node_gives_its_own_numbers_and_mode(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, DEVICES_580, None)
    (tmp_path / "dev" / "nvidiactl").symlink_to("/dev/null")  # a real character device on every Linux host
    st = os.stat("/dev/null")
    node = HostDevices(proc, tmp_path / "dev").card_nodes(0)[0]
    assert node == DeviceNode("/dev/nvidiactl", os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777)


def test_mig_nodes_add_the_instance_capabilities(tmp_path: Path) -> None:
    minors = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi1/access 147\n"
    proc = proc_tree(tmp_path, DEVICES_580, minors)
    caps = proc / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig" / "gi1"
    caps.mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    nodes = HostDevices(proc, tmp_path / "dev").mig_nodes(0, 1, 0)
    assert [n.path for n in nodes[:4]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    assert nodes[4:] == (
        DeviceNode("/dev/nvidia-caps/nvidia-cap12", 241, 12, 0o400),  # the driver's DeviceFileMode for this one
        DeviceNode("/dev/nvidia-caps/nvidia-cap13", 241, 13, 0o444),  # no proc entry: read-only for all
    )


def test_mig_nodes_without_mig_minors_give_no_capability(tmp_path: Path) -> None:
    nodes = HostDevices(proc_tree(tmp_path, DEVICES_580, None), tmp_path / "dev").mig_nodes(0, 1, 0)
    assert not any(n.path.startswith("/dev/nvidia-caps/") for n in nodes)


def test_tables_are_reread_after_a_driver_reload(tmp_path: Path) -> None:
    now = [0.0]
    proc = proc_tree(tmp_path, DEVICES_580, None)
    devices = HostDevices(proc, tmp_path / "dev", clock=lambda: now[0])
    assert devices.card_nodes(0)[1].major == 238
    (proc / "devices").write_text(DEVICES_580.replace("238 nvidia-uvm", "236 nvidia-uvm"))
    assert devices.card_nodes(0)[1].major == 238  # within the cache lifetime
    now[0] = 60.0
    assert devices.card_nodes(0)[1].major == 236


# Real mig-minors lines quoted by NVIDIA (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go, a comment listing
# the file) and the gpu0/gi1 pair that follows from nv-caps.c's table; the simulated file must match them exactly.
@pytest.mark.parametrize(
    ("line"),
    [
        "config 1",
        "monitor 2",
        "gpu0/gi0/access 3",
        "gpu0/gi0/ci0/access 4",
        "gpu0/gi0/ci2/access 6",
        "gpu0/gi1/access 12",
        "gpu0/gi1/ci0/access 13",
        "gpu3/gi3/ci3/access 439",
        "gpu3/gi3/ci5/access 441",
        "gpu6/gi11/ci5/access 918",
        "gpu6/gi11/ci7/access 920",
    ],
)
def test_simulated_mig_minors_match_the_driver(line: str) -> None:
    assert line in mig_minors_text().splitlines()


def test_simulated_tables_cover_32_gpus_with_15_instances_of_8_compute_instances() -> None:
    minors = parse_mig_minors(mig_minors_text())
    assert len(minors) == 2 + 32 * 15 * 9
    assert minors["gpu31/gi14/ci7/access"] == 3 + 32 * 135 - 1
    assert len(set(minors.values())) == len(minors)  # one node per capability


def test_simulated_node_gives_mig_partitions_real_looking_caps_nodes(tmp_path: Path) -> None:
    write_driver_tables(tmp_path / "sim")
    devices = simulated_host_devices(tmp_path / "sim")
    assert parse_proc_devices(PROC_DEVICES)["nvidia-caps"] == 241
    nodes = devices.mig_nodes(6, 1, 0)
    assert nodes[-2:] == (
        DeviceNode("/dev/nvidia-caps/nvidia-cap822", 241, 822, 0o444),
        DeviceNode("/dev/nvidia-caps/nvidia-cap823", 241, 823, 0o444),
    )
    assert DeviceNode("/dev/nvidia6", 195, 6, 0o666) in nodes
    stale = tmp_path / "sim" / "proc" / "stale"
    stale.write_text("x")
    write_driver_tables(tmp_path / "sim")  # a new run starts from fresh tables
    assert not stale.exists()
