"""The simulated node's profiling model: GPM ratios and byte rates derived from the same load as utilization.

A simulated card's load (the sum of its processes' loads, wobbling slowly) already drives utilization, power,
clocks and temperatures. The GPM readings follow it with fixed shares that keep the relations a real card shows:
SM active never exceeds graphics-engine active, occupancy stays below SM active, the tensor pipes carry most of a
training job's SM time, DRAM activity matches the memory utilization the sample reports (load x 0.55). On a MIG
card each GPU instance is driven by its own processes, and the card's values are the SM-weighted mean of its
instances. The H200 has 7 NVDEC, 7 NVJPG and 1 NVOFA engines and no NVENC; the simulated node runs no video
work, so they read 0 (supported and idle), as the captured card's encoder utilization did.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from exporter.backends.types import MediaEngine, ProfilingMetric, ProfilingSample

SM_SHARE: Final = 0.85  # of graphics-engine active
OCCUPANCY_SHARE: Final = 0.45  # of SM active
TENSOR_SHARE: Final = 0.6  # of SM active, any tensor pipe
DRAM_SHARE: Final = 0.55  # of load: the same factor as the simulated memory utilization
PIPE_SHARES: Final[Mapping[ProfilingMetric, float]] = {  # of SM active
    ProfilingMetric.TENSOR_HMMA_ACTIVE: TENSOR_SHARE * 0.92,
    ProfilingMetric.TENSOR_IMMA_ACTIVE: TENSOR_SHARE * 0.04,
    ProfilingMetric.TENSOR_DFMA_ACTIVE: 0.0,
    ProfilingMetric.TENSOR_DMMA_ACTIVE: 0.0,
    ProfilingMetric.FP64_ACTIVE: 0.01,
    ProfilingMetric.FP32_ACTIVE: 0.3,
    ProfilingMetric.FP16_ACTIVE: 0.12,
    ProfilingMetric.INTEGER_ACTIVE: 0.18,
}
H200_ENGINES: Final[Mapping[MediaEngine, int]] = {MediaEngine.NVDEC: 7, MediaEngine.NVJPG: 7, MediaEngine.NVOFA: 1}

PCIE_BYTES_PER_SECOND_BUSY: Final = 8e9  # host <-> card at full load (data loading, checkpoints)
PCIE_TX_SHARE: Final = 0.4
PCIE_IDLE_TX: Final = 1.5e5
PCIE_IDLE_RX: Final = 1.0e5
NVLINK_BYTES_PER_SECOND_BUSY: Final = 150e9  # per card and direction, all links, at full load


def activity(load: float) -> dict[ProfilingMetric, float]:
    """The ratios of a card or GPU instance whose work keeps the graphics engine busy ``load`` of the time."""
    load = min(max(load, 0.0), 1.0)
    sm = load * SM_SHARE
    values = {
        ProfilingMetric.GRAPHICS_ACTIVE: load,
        ProfilingMetric.SM_ACTIVE: sm,
        ProfilingMetric.SM_OCCUPANCY: sm * OCCUPANCY_SHARE,
        ProfilingMetric.TENSOR_ACTIVE: sm * TENSOR_SHARE,
        ProfilingMetric.DRAM_ACTIVE: load * DRAM_SHARE,
    }
    values.update({metric: sm * share for metric, share in PIPE_SHARES.items()})
    return {metric: round(value, 4) for metric, value in values.items()}


def pcie_rates(load: float) -> tuple[float, float]:
    """(transmit, receive) bytes per second over PCIe."""
    return (
        PCIE_IDLE_TX + PCIE_BYTES_PER_SECOND_BUSY * load * PCIE_TX_SHARE,
        PCIE_IDLE_RX + PCIE_BYTES_PER_SECOND_BUSY * load,
    )


def card_sample(load: float, links_up: int, links: int, interval: float) -> ProfilingSample:
    """The whole card: activity, PCIe, NVLink (scaled by the links that are up) and idle media engines."""
    metrics = activity(load)
    tx, rx = pcie_rates(load)
    metrics[ProfilingMetric.PCIE_TX_BYTES_PER_SECOND] = tx
    metrics[ProfilingMetric.PCIE_RX_BYTES_PER_SECOND] = rx
    if links:
        nvlink = NVLINK_BYTES_PER_SECOND_BUSY * load * links_up / links
        metrics[ProfilingMetric.NVLINK_TX_BYTES_PER_SECOND] = nvlink
        metrics[ProfilingMetric.NVLINK_RX_BYTES_PER_SECOND] = nvlink
    engines = {(engine, n): 0.0 for engine, count in H200_ENGINES.items() for n in range(count)}
    return ProfilingSample(interval, MappingProxyType(metrics), MappingProxyType(engines))


def mig_card_sample(
    instances: Mapping[int, tuple[float, int]], card_sms: int, links_up: int, links: int, interval: float
) -> ProfilingSample:
    """A MIG card: ``instances`` maps each GPU instance to (load, SM count); ratios are the SM-weighted mean."""
    weighted = sum(load * sms for load, sms in instances.values()) / max(card_sms, 1)
    return card_sample(weighted, links_up, links, interval)


def instance_sample(load: float, interval: float) -> ProfilingSample:
    """One GPU instance: its own SM, pipe and DRAM activity (PCIe and NVLink belong to the card)."""
    return ProfilingSample(interval, MappingProxyType(activity(load)))


class Brackets:
    """Two readings bracket each interval, as with GPM: the first call for a device only opens it. Keys are
    (gpu instance id or -1 for the card, MIG uuid); an interval shorter than ``min_interval`` is not closed."""

    def __init__(self, min_interval: float = 0.1) -> None:
        self._min = min_interval
        self._opened: dict[tuple[int, str], float] = {}

    def close(self, key: tuple[int, str], now: float) -> float | None:
        """The length of the interval that ends now, or None (first reading, or too soon after the last)."""
        opened = self._opened.get(key)
        if opened is not None and now - opened < self._min:
            return None
        self._opened[key] = now
        return None if opened is None else now - opened

    def keep(self, keys: set[tuple[int, str]]) -> None:
        """Forget GPU instances that are gone (the card's own key stays)."""
        for key in [k for k in self._opened if k[0] >= 0 and k not in keys]:
            del self._opened[key]


__all__ = [
    "NVLINK_BYTES_PER_SECOND_BUSY",
    "PCIE_BYTES_PER_SECOND_BUSY",
    "Brackets",
    "activity",
    "card_sample",
    "instance_sample",
    "mig_card_sample",
    "pcie_rates",
]
