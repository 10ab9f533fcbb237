"""The Backend contract's shared parts: which backends it runs on, how to make one, and the type tables."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from exporter.backends.protocol import Backend
from exporter.backends.types import (
    UNSUPPORTED,
    ComputeMode,
    EccCounts,
    RemappedRows,
)

REAL_NVML = os.environ.get("XPU_TEST_REAL_NVML") == "1"
PCI_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]$")
PROFILE_NAME = re.compile(r"^(\d+)g\.\d+gb")
H200_STYLE_MEMORY_SLICES = 8  # Hopper (H100/H200) cards split memory into 8 MIG slices

BACKENDS = [
    pytest.param("simulated:h200x8", id="simulated-h200x8"),
    pytest.param("simulated:h200x1", id="simulated-h200x1"),
    pytest.param(
        "nvml",
        id="nvml",
        marks=[
            pytest.mark.real_nvml,
            pytest.mark.skipif(not REAL_NVML, reason="real NVML: set XPU_TEST_REAL_NVML=1 on a machine with a GPU"),
        ],
    ),
]


def make_backend(kind: str) -> Backend:
    if kind == "nvml":
        from exporter.backends.nvml import NvmlBackend

        return NvmlBackend()
    from exporter.backends.scenario import load_scenario
    from exporter.backends.simulated import SimulatedBackend

    return SimulatedBackend(load_scenario(kind.removeprefix("simulated:")))


def indexes(backend: Backend) -> range:
    return range(backend.device_count())


def check_type(owner: str, name: str, value: Any, kinds: tuple[type, ...]) -> None:
    """``value`` is UNSUPPORTED or one of ``kinds``; a bool never passes for a number."""
    assert value is not None, f"{owner}.{name} is None (must be a value or UNSUPPORTED)"
    if value is UNSUPPORTED:
        return
    assert isinstance(value, kinds), f"{owner}.{name}={value!r} is {type(value).__name__}, want {kinds}"
    if bool not in kinds:
        assert not isinstance(value, bool), f"{owner}.{name}={value!r} is a bool, want a number"


INT = (int,)
NUMBER = (int, float)
BOOL = (bool,)

SAMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "gpu_utilization_ratio": NUMBER,
    "memory_utilization_ratio": NUMBER,
    "memory_used_bytes": INT,
    "memory_free_bytes": INT,
    "memory_reserved_bytes": INT,
    "temperature_gpu_celsius": NUMBER,
    "temperature_memory_celsius": NUMBER,
    "power_draw_watts": NUMBER,
    "power_limit_watts": NUMBER,
    "energy_joules": NUMBER,
    "sm_clock_mhz": INT,
    "memory_clock_mhz": INT,
    "clock_event_reasons": INT,
    "performance_state": INT,
    "pcie_generation": INT,
    "pcie_width": INT,
    "pcie_replay_count": INT,
    "ecc": (EccCounts,),
    "remapped_rows": (RemappedRows,),
    "recovery_action": INT,
    "nvlinks": (tuple,),
    "compute_mode": (ComputeMode,),
    "persistence_mode": BOOL,
    "mig_mode_current": BOOL,
    "mig_mode_pending": BOOL,
}
REQUIRED_SAMPLE_FIELDS = {"memory_used_bytes", "memory_free_bytes", "ecc"}

INFO_TYPES: dict[str, tuple[type, ...]] = {
    "index": INT,
    "uuid": (str,),
    "name": (str,),
    "pci_bus_id": (str,),
    "serial": (str,),
    "minor_number": INT,
    "memory_total_bytes": INT,
    "sm_clock_max_mhz": INT,
    "memory_clock_max_mhz": INT,
    "pcie_generation_max": INT,
    "pcie_width_max": INT,
    "power_limit_default_mw": INT,
    "nvlink_count": INT,
    "mig_capable": BOOL,
    "compute_capability": (tuple,),
    "vbios_version": (str,),
}
REQUIRED_INFO_FIELDS = {"index", "uuid", "name", "pci_bus_id", "memory_total_bytes", "nvlink_count", "mig_capable"}
