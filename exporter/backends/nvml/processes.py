"""A card's compute processes through NVML, with their memory and (where the driver keeps it) SM use.

``nvmlDeviceGetProcessUtilization`` returns the samples newer than a timestamp the caller passes; :class:`ProcessReader`
keeps the newest timestamp seen per card, so each call returns only what happened since the previous one. It costs
about 2.9 ms on an H200, so it is made once per cycle and only when the card runs processes.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Final

import pynvml

from exporter.backends.nvml.calls import UNSUPPORTED_CODES, error_code, ratio, translate
from exporter.backends.nvml.handles import DeviceHandle
from exporter.backends.types import UNKNOWN, UNSUPPORTED, GpuProcess, Unknown, Unsupported

_INVALID_ID: Final = 0xFFFFFFFF  # NVML's "no GPU instance" / "not available" for 32-bit ids


class ProcessReader:
    """Process lists of every card; thread-safe (each card's calls come from its own lane)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._util_seen: dict[int, int] = {}  # gpu -> last process-utilization timestamp (us)

    def read(self, index: int, h: DeviceHandle) -> tuple[GpuProcess, ...] | Unknown:
        running = running_processes(h)
        if isinstance(running, Unknown):
            return UNKNOWN
        if isinstance(running, Unsupported) or not running:
            return ()
        sm_util = self._sm_util(index, h)
        by_pid: dict[int, GpuProcess] = {}
        for proc in running:
            pid = int(proc.pid)
            used = proc.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE
            gi = getattr(proc, "gpuInstanceId", None)
            entry = GpuProcess(
                pid=pid,
                used_memory_bytes=UNSUPPORTED if used is None else int(used),
                sm_utilization_ratio=sm_util.get(pid, UNSUPPORTED),
                gpu_instance_id=UNSUPPORTED if gi is None or int(gi) == _INVALID_ID else int(gi),
            )
            previous = by_pid.get(pid)
            if previous is not None:
                # Listed twice (e.g. once per MIG compute instance): one entry, memory added up where known.
                a, b = previous.used_memory_bytes, entry.used_memory_bytes
                memory = b if isinstance(a, Unsupported) else a if isinstance(b, Unsupported) else a + b
                entry = dataclasses.replace(previous, used_memory_bytes=memory)
            by_pid[pid] = entry
        return tuple(by_pid.values())

    def forget(self, index: int | None = None) -> None:
        """Start one card's (or every card's) utilization samples afresh: the card was reset or NVML closed."""
        with self._lock:
            if index is None:
                self._util_seen.clear()
            else:
                self._util_seen.pop(index, None)

    def _sm_util(self, index: int, h: DeviceHandle) -> dict[int, float]:
        """SM use per PID from samples newer than the last call's."""
        with self._lock:
            since = self._util_seen.get(index, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, since)
        except pynvml.NVMLError as err:
            # NotFound: no samples since the timestamp. pynvml raises NVMLError(SUCCESS) for an empty buffer.
            if error_code(err) in UNSUPPORTED_CODES | {pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS}:
                return {}
            raise translate(err, "nvmlDeviceGetProcessUtilization") from err
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            stamp, pid = int(s.timeStamp), int(s.pid)
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, int(s.smUtil))
        if latest:
            with self._lock:
                self._util_seen[index] = max(stamp for stamp, _ in latest.values())
        return {pid: ratio(sm) for pid, (_, sm) in latest.items()}


def running_processes(h: DeviceHandle) -> list[Any] | Unsupported | Unknown:
    """The card's compute processes; UNKNOWN where NVML refuses the list (NO_PERMISSION: with MIG on the parent's
    list needs privileges) rather than failing the card's whole sample."""
    for name, fn in (
        ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.nvmlDeviceGetComputeRunningProcesses_v3),
        ("nvmlDeviceGetComputeRunningProcesses_v2", pynvml.nvmlDeviceGetComputeRunningProcesses_v2),  # before 510
    ):
        try:
            return list(fn(h))
        except pynvml.NVMLError as err:
            code = error_code(err)
            if code == pynvml.NVML_ERROR_NO_PERMISSION:
                return UNKNOWN
            if code not in UNSUPPORTED_CODES:
                raise translate(err, name) from err
    return UNSUPPORTED


__all__ = ["ProcessReader", "running_processes"]
