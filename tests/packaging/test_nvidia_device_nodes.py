"""packaging/libexec/xpu-nvidia-device-nodes, which xpu-nvidia-modprobe.service runs before xpu-healthd: one
`nvidia-modprobe -c=N` for the minor of every card in /proc/driver/nvidia/gpus, after `-u -c=0`.

The gpus directory is laid out as the kernel module writes it (kernel-open/nvidia/nv-procfs.c in NVIDIA's
open-gpu-kernel-modules, nv_procfs_read_gpu_info: one directory per card named by its PCI address, whose
`information` file has the line "Device Minor: \\t N"). nvidia-modprobe is a stand-in that records its arguments.
What this does not prove: that the real nvidia-modprobe makes the node (NVIDIA's binary; tests/packaging/
test_deb_nspawn.py runs the script under systemd, with a stand-in that also creates the nodes).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.servicehelpers import REPO

SCRIPT = REPO / "packaging" / "libexec" / "xpu-nvidia-device-nodes"
# A real file's lines, the minor among them (nv-procfs.c prints these fields in this order).
INFORMATION = (
    "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{uuid}\nVideo BIOS: \t 96.00.a5.00.01\n"
    "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
    "Device Minor: \t {minor}\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
)
# 8 cards whose minors do not follow the PCI order, as on HGX boards; minor 5 is missing (an excluded card keeps its
# number), minor 9 is there instead.
CARDS = {
    "0000:18:00.0": 2,
    "0000:2a:00.0": 0,
    "0000:3a:00.0": 3,
    "0000:5d:00.0": 1,
    "0000:9a:00.0": 6,
    "0000:ab:00.0": 4,
    "0000:ba:00.0": 9,
    "0000:db:00.0": 7,
}


def fake_gpus(root: Path, cards: dict[str, int]) -> Path:
    gpus = root / "gpus"
    for n, (bus, minor) in enumerate(cards.items()):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(INFORMATION.format(uuid=f"{n:08x}", bus=bus, minor=minor))
    return gpus


def fake_modprobe(root: Path, fail_for: str = "") -> tuple[Path, Path]:
    log = root / "modprobe.log"
    exe = root / "nvidia-modprobe"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$*" != "{fail_for}" ]\n')
    exe.chmod(0o755)
    return exe, log


def run(*args: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=30, check=False)


def test_every_listed_card_gets_its_node(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path)
    done = run(exe, fake_gpus(tmp_path, CARDS))
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "-u -c=0", "the modules first: the gpus directory exists only once nvidia is loaded"
    assert sorted(calls[1:]) == sorted(f"-c={m}" for m in CARDS.values() if m != 0)
    assert len(calls) == len(CARDS), "minor 0 is not made twice"


def test_no_card_listed_still_loads_the_modules(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path)
    done = run(exe, tmp_path / "no-such-dir")
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["-u -c=0"]


def test_a_failure_is_reported_and_the_other_cards_are_still_tried(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path, fail_for="-c=3")
    gpus = fake_gpus(tmp_path, CARDS)
    (gpus / "0000:ff:00.0").mkdir()
    (gpus / "0000:ff:00.0" / "information").write_text("Model: \t\t NVIDIA H200\n")  # no minor line
    done = run(exe, gpus)
    assert done.returncode == 1
    assert "no device minor in" in done.stderr and "0000:ff:00.0" in done.stderr
    assert len(log.read_text().splitlines()) == len(CARDS), "every card is tried"
