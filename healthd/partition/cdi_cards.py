"""Whole-card CDI devices: one per GPU, named by the card's UUID (``xpu-runtime-kit.io/gpu=GPU-...``).

The device plugin hands whole cards to containers by these names; partitions keep their ``p-...`` names in the
same spec. A whole-card device carries only device nodes (the card's ``/dev/nvidia<minor>`` and the control
nodes), no environment: a container given several cards gets one device per card, and per-device variables such
as ``CUDA_VISIBLE_DEVICES`` would overwrite each other. Whoever hands out the cards sets the environment.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.backends.types import DeviceInfo, Unsupported
from healthd.host.devices import HostDevices
from healthd.partition.edits import ContainerEdits


def whole_card_devices(cards: Iterable[DeviceInfo], devices: HostDevices) -> list[tuple[str, ContainerEdits]]:
    """(CDI device name, edits) for every card, with numbered nodes (the card's and the control nodes); the minor
    number falls back to the index when NVML has none."""
    out = []
    for info in cards:
        minor = info.index if isinstance(info.minor_number, Unsupported) else info.minor_number
        out.append((info.uuid, ContainerEdits(device_nodes=devices.card_nodes(minor))))
    return out
