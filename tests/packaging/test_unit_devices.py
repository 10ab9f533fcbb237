"""The unit's device allow-list against /proc/devices of drivers 535, 550 and 580, resolved as systemd resolves it.

With DevicePolicy=closed, systemd turns each DeviceAllow=char-NAME into the character majors whose /proc/devices name
matches NAME, when the unit starts. Driver 550 and later no longer register "nvidia-frontend" (major 195 is "nvidia"
and "nvidiactl"), so a unit that named only the old one hid every GPU from NVML. Each sample in
tests/fixtures/proc-devices says where its names come from; packaging/deviceallow.py is the resolver (systemd's
rules: fnmatch on the name, every minor of a matched major; a /dev path is that one device number).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.servicehelpers import REPO

SAMPLES = REPO / "tests" / "fixtures" / "proc-devices"
UNIT = REPO / "packaging" / "systemd" / "xpu-healthd.service"
DRIVERS = ("535", "550", "580")
GPUS = 8


def load_resolver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deviceallow", REPO / "packaging" / "deviceallow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deviceallow"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


da = load_resolver()


def sample(driver: str) -> dict[str, list[tuple[int, str]]]:
    return da.proc_devices((SAMPLES / f"driver-{driver}.txt").read_text())  # type: ignore[no-any-return]


def major(devices: dict[str, list[tuple[int, str]]], name: str) -> int:
    (number,) = [m for m, n in devices["c"] if n == name]
    return number


def gpu_nodes(devices: dict[str, list[tuple[int, str]]]) -> list[object]:
    """The nodes NVML, MIG and CUDA open on an 8-GPU node, with the numbers this driver gives them."""
    uvm, caps = major(devices, "nvidia-uvm"), major(devices, "nvidia-caps")
    return [
        *(da.Node(f"/dev/nvidia{i}", "c", 195, i) for i in range(GPUS)),
        da.Node("/dev/nvidiactl", "c", 195, 255),
        da.Node("/dev/nvidia-uvm", "c", uvm, 0),
        da.Node("/dev/nvidia-uvm-tools", "c", uvm, 1),
        da.Node("/dev/nvidia-caps/nvidia-cap1", "c", caps, 1),  # MIG config
        da.Node("/dev/nvidia-caps/nvidia-cap2", "c", caps, 2),  # MIG monitor
        da.Node("/dev/nvidia-caps/nvidia-cap10", "c", caps, 10),  # a GPU/compute instance's access node
    ]


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_gpu_node_is_allowed(driver: str) -> None:
    rules = da.device_rules(UNIT.read_text())
    devices = sample(driver)
    denied = [n.path for n in gpu_nodes(devices) if not da.allows(rules, devices, n, "rw")]
    assert denied == [], f"driver {driver}: the unit denies {denied}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_nvlink_and_nvswitch_nodes_are_allowed(driver: str) -> None:
    rules = da.device_rules(UNIT.read_text())
    devices = sample(driver)
    nodes = [
        da.Node("/dev/nvidia-nvlink", "c", major(devices, "nvidia-nvlink"), 0),
        da.Node("/dev/nvidia-nvswitchctl", "c", major(devices, "nvidia-nvswitch"), 255),
        da.Node("/dev/nvidia-nvswitch0", "c", major(devices, "nvidia-nvswitch"), 0),
    ]
    assert all(da.allows(rules, devices, n, "rw") for n in nodes)


@pytest.mark.parametrize("driver", DRIVERS)
def test_nothing_else_is_allowed(driver: str) -> None:
    """The list stays narrow: other devices, and the kernel log for writing, are denied."""
    rules = da.device_rules(UNIT.read_text())
    devices = sample(driver)
    assert da.allows(rules, devices, da.Node("/dev/kmsg", "c", 1, 11), "r")
    assert not da.allows(rules, devices, da.Node("/dev/kmsg", "c", 1, 11), "w")
    for node in (
        da.Node("/dev/mem", "c", 1, 1),
        da.Node("/dev/sda", "b", 8, 0),
        da.Node("/dev/dri/card0", "c", 226, 0),
        da.Node("/dev/hidraw0", "c", major(devices, "hidraw"), 0),
    ):
        assert not da.allows(rules, devices, node, "r"), node
    if driver != "535":  # IMEX channels (multi-node NVLink) are not the daemon's business
        imex = da.Node("/dev/nvidia-caps-imex-channels/channel0", "c", major(devices, "nvidia-caps-imex-channels"), 0)
        assert not da.allows(rules, devices, imex, "r")


def test_the_old_list_fails_on_new_drivers() -> None:
    """The check catches the defect it guards against: naming only nvidia-frontend hides the cards from 550 on."""
    old = [da.Rule("char-nvidia-frontend", "rw"), da.Rule("char-nvidia-caps", "rw"), da.Rule("char-nvidia-uvm", "rw")]
    assert all(da.allows(old, sample("535"), n, "rw") for n in gpu_nodes(sample("535")))
    for driver in ("550", "580"):
        devices = sample(driver)
        denied = {n.path for n in gpu_nodes(devices) if not da.allows(old, devices, n, "rw")}
        assert denied == {f"/dev/nvidia{i}" for i in range(GPUS)} | {"/dev/nvidiactl"}


def test_resolution_follows_systemd() -> None:
    """fnmatch on the whole name, every minor of the major, a missing name resolves to nothing, sections apart."""
    text = "Character devices:\n195 nvidia\n195 nvidiactl\n236 nvidia-uvm\n\nBlock devices:\n236 nvidia-uvm\n"
    devices = da.proc_devices(text)
    assert devices == {"c": [(195, "nvidia"), (195, "nvidiactl"), (236, "nvidia-uvm")], "b": [(236, "nvidia-uvm")]}
    resolved = da.resolve(da.Rule("char-nvidia", "rw"), devices, {})
    assert [(n.kind, n.major, n.minor) for n in resolved] == [("c", 195, -1)]  # not nvidia-uvm: the whole name
    assert [n.major for n in da.resolve(da.Rule("char-nvidia*", "rw"), devices, {})] == [195, 236]
    assert da.resolve(da.Rule("char-nvidia-frontend", "rw"), devices, {}) == []
    assert [n.kind for n in da.resolve(da.Rule("block-nvidia-uvm", "r"), devices, {})] == ["b"]
    assert da.device_rules("# DeviceAllow=char-x rw\nDeviceAllow=char-y\nDeviceAllow=/dev/kmsg r\n") == [
        da.Rule("char-y", "rwm"),
        da.Rule("/dev/kmsg", "r"),
    ]


@pytest.mark.parametrize("driver", DRIVERS)
def test_samples_say_where_their_names_come_from(driver: str) -> None:
    header = [line for line in (SAMPLES / f"driver-{driver}.txt").read_text().splitlines() if line.startswith("#")]
    assert f"driver {driver}" in " ".join(header)
    assert "Names" in " ".join(header)


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) needs root")
def test_report_on_a_device_directory(tmp_path: Path) -> None:
    """The device check's view: real nodes under a /dev-like directory, judged against /proc/devices text."""
    (tmp_path / "nvidia-caps").mkdir()
    for name, number in (("nvidia0", (195, 0)), ("nvidiactl", (195, 255)), ("nvidia-uvm", (238, 0))):
        os.mknod(tmp_path / name, 0o600 | 0o020000, os.makedev(*number))
    os.mknod(tmp_path / "nvidia-caps" / "nvidia-cap1", 0o400 | 0o020000, os.makedev(241, 1))
    os.mknod(tmp_path / "nvidia-mystery", 0o600 | 0o020000, os.makedev(243, 0))  # hidraw's major: not a GPU's
    lines, denied = da.report(UNIT.read_text(), (SAMPLES / "driver-580.txt").read_text(), tmp_path)
    text = "\n".join(lines)
    assert "  char-nvidia rw: major 195" in text
    assert "  char-nvidia-frontend rw: nothing (no such name in /proc/devices)" in text
    assert f"  {tmp_path}/nvidia-caps/nvidia-cap1 241:1: rw" in text
    assert f"  {tmp_path}/nvidia-mystery 243:0: DENIED" in text
    assert denied


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) needs root")
def test_imex_channels_are_reported_as_not_needed_never_denied(tmp_path: Path) -> None:
    """A node with IMEX channels (driver 550+, multi-node NVLink) passes the check: the daemon never opens them."""
    (tmp_path / "nvidia-caps-imex-channels").mkdir()
    os.mknod(tmp_path / "nvidia0", 0o600 | 0o020000, os.makedev(195, 0))
    for channel in range(2):
        node = tmp_path / "nvidia-caps-imex-channels" / f"channel{channel}"
        os.mknod(node, 0o600 | 0o020000, os.makedev(242, channel))  # "nvidia-caps-imex-channels" in driver-580.txt
    lines, denied = da.report(UNIT.read_text(), (SAMPLES / "driver-580.txt").read_text(), tmp_path)
    text = "\n".join(lines)
    assert f"  {tmp_path}/nvidia-caps-imex-channels/channel1 242:1: not needed (IMEX channel" in text
    assert "DENIED" not in text
    assert not denied
    assert da.main(["--proc-devices", str(SAMPLES / "driver-580.txt"), "--dev", str(tmp_path)]) == 0
