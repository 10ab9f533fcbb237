"""A /proc/driver/nvidia/gpus layout of 8 cards, as the kernel module writes it (NVIDIA open-gpu-kernel-modules,
kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info: one directory per card named by its PCI address, whose
``information`` file has the line "Device Minor: \\t N"), for tests of the device-node script."""

from __future__ import annotations

from pathlib import Path

# A real file's lines, in the order nv-procfs.c prints them.
INFORMATION = (
    "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{uuid}\nVideo BIOS: \t 96.00.a5.00.01\n"
    "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
    "Device Minor: \t {minor}\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
)
# Minors that do not follow the PCI order, as on HGX boards; 5 is missing (an excluded card keeps its number) and
# 9 is there instead.
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


def write_gpus(gpus: Path, cards: dict[str, int] = CARDS) -> Path:
    for n, (bus, minor) in enumerate(cards.items()):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(INFORMATION.format(uuid=f"{n:08x}-0000", bus=bus, minor=minor))
    return gpus
