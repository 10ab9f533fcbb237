"""Backend.nvlink_peers: the simulated node, and the NVML translation with NVML's answers stubbed (no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from exporter.backends.nvml import NvmlBackend
from exporter.backends.simulated import SimulatedBackend
from exporter.backends.types import UNSUPPORTED, DeviceInfo


def test_simulated_h200x8_links_go_to_nvswitch() -> None:
    sim = SimulatedBackend.from_name("h200x8")
    sim.open()
    assert sim.nvlink_peers(0) == ("nvswitch",) * 18
    sim.inject("nvlink_down", 0, {"link": "3"})
    assert sim.nvlink_peers(0) == ("nvswitch",) * 17


def test_simulated_single_card_has_no_nvlink() -> None:
    sim = SimulatedBackend.from_name("h200x1")
    sim.open()
    assert sim.nvlink_peers(0) is UNSUPPORTED


def _nvml_with_links(links: tuple[int, ...]) -> NvmlBackend:
    b = NvmlBackend()
    b._open = True
    b._count = 1
    b._handles[0] = object()
    b._infos[0] = DeviceInfo(
        0,
        "GPU-x",
        "NVIDIA H200",
        "00000000:18:00.0",
        UNSUPPORTED,
        0,
        1,
        1,
        1,
        5,
        16,
        700000,
        len(links),
        True,
        (9, 0),
        UNSUPPORTED,
    )
    b._links[0] = links
    return b


def test_nvml_peers_switch_gpu_and_inactive_links(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {0: 1, 1: 1, 2: 0, 3: 1}

    def remote_type(_h: Any, link: int) -> int:
        if link == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # old driver: fall back to the PCI info
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if link == 0 else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", lambda _h, link: state[link])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", remote_type)
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetNvLinkRemotePciInfo",
        lambda _h, link: SimpleNamespace(busId=b"00000000:2A:00.0" if link == 1 else b"00000000:3A:00.0"),
    )
    b = _nvml_with_links((0, 1, 2, 3))
    assert b.nvlink_peers(0) == ("nvswitch", "00000000:2A:00.0", "00000000:3A:00.0")


def test_nvml_no_links_is_unsupported() -> None:
    assert _nvml_with_links(()).nvlink_peers(0) is UNSUPPORTED
