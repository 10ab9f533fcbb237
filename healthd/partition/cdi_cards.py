"""Whole-card CDI devices: one per GPU in partition mode ``none``, named by the card's UUID
(``xpu-runtime-kit.io/gpu=GPU-...``).

A card in mode ``tdm`` or ``mig`` is listed only through its partitions: a whole-card device for it would give a
container the card with no MPS environment, past every TDM quota and beside every MIG instance on it.

The device plugin hands whole cards to containers by these names; partitions keep their ``p-...`` names in the
same spec. A whole-card device carries only device nodes (the card's ``/dev/nvidia<minor>`` and the control
nodes), no environment: a container given several cards gets one device per card, and per-device variables such
as ``CUDA_VISIBLE_DEVICES`` would overwrite each other. Whoever hands out the cards sets the environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.backends.types import DeviceInfo, Unsupported
from healthd.host.devices import HostDevices
from healthd.partition.edits import ContainerEdits
from healthd.partition.model import CardMode


def whole_card_devices(
    cards: Iterable[DeviceInfo], modes: Mapping[int, CardMode], devices: HostDevices
) -> list[tuple[str, ContainerEdits]]:
    """(CDI device name, edits) for every card whose mode is ``none``, with numbered nodes (the card's and the
    control nodes); the minor number falls back to the index when NVML has none. A card with no known mode (not
    learned yet) is left out."""
    out = []
    for info in cards:
        if modes.get(info.index) is not CardMode.NONE:
            continue
        minor = info.index if isinstance(info.minor_number, Unsupported) else info.minor_number
        out.append((info.uuid, ContainerEdits(device_nodes=devices.card_nodes(minor))))
    return out
