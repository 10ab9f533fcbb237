"""What NVML hands out and this package hands back: opaque handles, and the C structs it reads fields of.

pynvml has no type hints, so every value it returns is untyped. The handles get a type each (nothing here looks
into one, except :func:`exporter.backends.nvml.events.handle_key` for its address): a signature then says which
handle it takes, and mypy keeps a GPU instance's handle from going where a card's goes. The structs get a Protocol
naming the fields read from them (pynvml's ``c_nvml*_t`` ctypes structures, from nvml.h).
"""

from __future__ import annotations

from typing import NewType, Protocol

DeviceHandle = NewType("DeviceHandle", object)  # nvmlDevice_t: a card, or one of its MIG devices
GpuInstanceHandle = NewType("GpuInstanceHandle", object)  # nvmlGpuInstance_t
ComputeInstanceHandle = NewType("ComputeInstanceHandle", object)  # nvmlComputeInstance_t
EventSetHandle = NewType("EventSetHandle", object)  # nvmlEventSet_t
GpmSample = NewType("GpmSample", object)  # nvmlGpmSample_t: one GPM snapshot of a card (or a MIG instance)


class FieldValue(Protocol):
    """nvmlFieldValue_t: one answer of nvmlDeviceGetFieldValues; ``value`` is a union read by the member
    ``valueType`` names."""

    nvmlReturn: int
    valueType: int
    value: object


class EventData(Protocol):
    """nvmlEventData_t (the instance ids only in pynvml builds that have them, read with getattr)."""

    device: DeviceHandle
    eventType: int
    eventData: int


class GpuInstanceProfileInfo(Protocol):
    """nvmlGpuInstanceProfileInfo_t (v2 adds ``name``, read with getattr)."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    memorySizeMB: int


class ComputeInstanceProfileInfo(Protocol):
    """nvmlComputeInstanceProfileInfo_t."""

    id: int
    sliceCount: int
    instanceCount: int


__all__ = [
    "ComputeInstanceHandle",
    "ComputeInstanceProfileInfo",
    "DeviceHandle",
    "EventData",
    "EventSetHandle",
    "FieldValue",
    "GpmSample",
    "GpuInstanceHandle",
    "GpuInstanceProfileInfo",
]
