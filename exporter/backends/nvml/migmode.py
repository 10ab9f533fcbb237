"""Each card's MIG mode, read from the driver only when it may have changed, not on every cycle.

``nvmlDeviceGetMigMode`` costs about 0.17 ms on an H200 and its answer changes only when a mode change is applied,
which takes a reset of the card. So the mode is read again:

- after the backend drops the card's caches (``forget``): a reset seen between samples, a handle NVML rejected, a
  card back from GPU_IS_LOST / RESET_REQUIRED, a MIG mode change noticed, NVML closed and opened again;
- when the card's utilization rates change between answered and NotSupported: NVML does not report them on a
  card in MIG mode (``nvmlDeviceGetUtilizationRates``: "On MIG-enabled GPUs, querying device utilization rates is
  not currently supported"), so that call, made every cycle anyway, shows a mode change applied on the same handle
  in the very cycle it happens;
- on every cycle while the pending mode differs from the current one (a change waits for its reset: the cycle
  after the reset sees it);
- every ``recheck_cycles`` cycles whatever else happens, for a change applied in a way none of the above sees
  (``nvidia-smi -mig`` on an idle card applies the mode at once, and NVML may keep the handle).

Thread-safe: each card's calls come from its own lane; the table is shared.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pynvml

from exporter.backends.nvml.calls import optional
from exporter.backends.nvml.handles import DeviceHandle
from exporter.backends.types import UNSUPPORTED, Unsupported

RECHECK_CYCLES = 12  # one minute at the default 5 s interval

MigMode = tuple[bool, bool] | Unsupported  # (current, pending)


@dataclass(slots=True)
class _Known:
    mode: MigMode
    utilization: bool | None = None  # whether the utilization rates answered when the mode was read
    cycles: int = 0  # cycles served from this reading


def read_mig_mode(h: DeviceHandle) -> MigMode:
    mode = optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)
    return UNSUPPORTED if isinstance(mode, Unsupported) else (bool(mode[0]), bool(mode[1]))


class MigModeCache:
    def __init__(self, recheck_cycles: int = RECHECK_CYCLES) -> None:
        self._recheck = recheck_cycles
        self._lock = threading.Lock()
        self._known: dict[int, _Known] = {}

    def for_cycle(self, index: int, h: DeviceHandle, utilization: bool) -> MigMode:
        """The mode for this cycle's sample of the card: the last reading while it holds, else a new one.
        ``utilization``: whether this cycle's ``nvmlDeviceGetUtilizationRates`` answered."""
        with self._lock:
            known = self._known.get(index)
            if known is not None and known.utilization is None:
                known.utilization = utilization  # read with the identity, before this cycle's utilization call
            if (
                known is not None
                and known.cycles + 1 < self._recheck
                and known.utilization == utilization
                and _settled(known.mode)
            ):
                known.cycles += 1
                return known.mode
        return self.read(index, h, utilization)

    def current(self, index: int, h: DeviceHandle) -> bool:
        """Whether MIG is on, from the last reading (read if there is none); does not count as a cycle."""
        with self._lock:
            known = self._known.get(index)
        mode = known.mode if known is not None else self.read(index, h)
        return not isinstance(mode, Unsupported) and mode[0]

    def forget(self, index: int | None = None) -> None:
        with self._lock:
            if index is None:
                self._known.clear()
            else:
                self._known.pop(index, None)

    def read(self, index: int, h: DeviceHandle, utilization: bool | None = None) -> MigMode:
        """A new reading, kept for the cycles that follow (the identity read after a renewal takes one)."""
        mode = read_mig_mode(h)
        with self._lock:
            self._known[index] = _Known(mode, utilization)
        return mode


def _settled(mode: MigMode) -> bool:
    return isinstance(mode, Unsupported) or mode[0] == mode[1]
