"""MIG through NVML: the GPU-instance profile table, the instances on a card, creating and destroying them.

Functions of a device handle, with no state of their own: :class:`exporter.backends.nvml.device.NvmlBackend` owns
the handles, caches the profile table and runs these on the card's lane.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Final

import pynvml

from exporter.backends.errors import BackendError, InvalidStateError, NotFoundError
from exporter.backends.nvml.calls import SKIP_CODES, call, error_code, list_call, optional, skippable, text, translate
from exporter.backends.nvml.handles import (
    ComputeInstanceHandle,
    ComputeInstanceProfileInfo,
    DeviceHandle,
    GpuInstanceHandle,
    GpuInstanceProfileInfo,
)
from exporter.backends.types import UNSUPPORTED, MediaEngines, MigInstance, MigProfile, Unsupported

_MIB: Final = 1024 * 1024
_MAX_PLACEMENTS: Final = 64  # more than any card's memory-slice count


def profile_name(raw: object, slices: int, memory_mib: int) -> str:
    """``"MIG 1g.18gb"`` -> ``"1g.18gb"``; synthesised like DCGM when the driver gives no name (v1 struct)."""
    name = text(raw).strip() if raw else ""
    if not name:
        return f"{slices}g.{(memory_mib + 1023) // 1024}gb"
    return name.removeprefix("MIG ").strip()


def read_profiles(h: DeviceHandle) -> tuple[MigProfile, ...]:
    """Every GPU-instance profile the card offers, with its legal placements; empty when not MIG capable."""
    profiles: list[MigProfile] = []
    seen: set[int] = set()
    for const in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _gi_profile_info(h, const)
        if info is None or int(info.id) in seen:
            continue
        seen.add(int(info.id))
        memory_mib = int(info.memorySizeMB)
        slices = int(info.sliceCount)
        placements = list_call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            pynvml.c_nvmlGpuInstancePlacement_t,
            _MAX_PLACEMENTS,
            h,
            int(info.id),
        )
        profiles.append(
            MigProfile(
                profile_id=int(info.id),
                name=profile_name(getattr(info, "name", ""), slices, memory_mib),
                slice_count=slices,
                memory_mib=memory_mib,
                sm_count=int(info.multiprocessorCount),
                instance_count=int(info.instanceCount),
                placements=tuple((int(p.start), int(p.size)) for p in placements),
                media=_media(info),
            )
        )
    return tuple(profiles)


_MEDIA_FIELDS = ("decoderCount", "encoderCount", "jpegCount", "ofaCount", "copyEngineCount")


def _media(info: object) -> MediaEngines | None:
    """The profile's engine counts; None when the structure lacks them (every NVML since R450 has them)."""
    if not all(hasattr(info, f) for f in _MEDIA_FIELDS):
        return None
    counts = [int(getattr(info, f)) for f in _MEDIA_FIELDS]
    return MediaEngines(*counts)


def _gi_profile_info(h: DeviceHandle, const: int) -> GpuInstanceProfileInfo | None:
    """Profile info by profile constant (v2 carries the name); None for constants this card lacks."""
    name = "nvmlDeviceGetGpuInstanceProfileInfo"
    try:
        info: GpuInstanceProfileInfo = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
        return info
    except pynvml.NVMLError as err:
        if error_code(err) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            if error_code(err) in SKIP_CODES:
                return None
            raise translate(err, name) from err
    return skippable(name, pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, const, 1)


def mig_enabled(h: DeviceHandle) -> bool:
    mode = optional("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)
    return not isinstance(mode, Unsupported) and bool(mode[0])


def require_enabled(index: int, h: DeviceHandle) -> None:
    """InvalidStateError unless MIG is on: NVML creates or destroys instances only in MIG mode."""
    if not mig_enabled(h):
        raise InvalidStateError(f"MIG is not enabled on GPU {index}", call="nvmlDeviceGetMigMode")


def list_instances(index: int, h: DeviceHandle, profiles: tuple[MigProfile, ...]) -> tuple[MigInstance, ...]:
    """The MIG devices of card ``index`` with MIG on (one per compute instance), by GPU and compute instance id."""
    by_id = {p.profile_id: p for p in profiles}
    gpu_instances: dict[int, tuple[MigProfile, int, int]] = {}  # gi id -> (profile, start, size)
    for profile in by_id.values():
        for gi in _gpu_instances(h, profile):
            gi_info = call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
            placement = gi_info.placement
            gpu_instances[int(gi_info.id)] = (profile, int(placement.start), int(placement.size))
    if not gpu_instances:
        return ()
    result: list[MigInstance] = []
    slots = int(call("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h))
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except pynvml.NVMLError as err:
            if error_code(err) in SKIP_CODES | {pynvml.NVML_ERROR_NOT_FOUND}:
                continue  # empty slot
            raise translate(err, "nvmlDeviceGetMigDeviceHandleByIndex") from err
        gi_id = int(call("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig))
        if gi_id not in gpu_instances:
            continue  # created after the walk above; the next call sees it
        profile, start, size = gpu_instances[gi_id]
        memory = optional("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, mig)
        attrs = optional("nvmlDeviceGetAttributes", pynvml.nvmlDeviceGetAttributes, mig)
        result.append(
            MigInstance(
                parent_index=index,
                gpu_instance_id=gi_id,
                compute_instance_id=int(
                    call("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig)
                ),
                profile_id=profile.profile_id,
                profile_name=profile.name,
                placement_start=start,
                placement_size=size,
                uuid=text(call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig)),
                sm_count=profile.sm_count if isinstance(attrs, Unsupported) else int(attrs.multiprocessorCount),
                memory_total_bytes=(
                    profile.memory_mib * _MIB if isinstance(memory, Unsupported) else int(memory.total)
                ),
                memory_used_bytes=UNSUPPORTED if isinstance(memory, Unsupported) else int(memory.used),
            )
        )
    return tuple(sorted(result, key=lambda m: (m.gpu_instance_id, m.compute_instance_id)))


def create_instance(
    index: int, h: DeviceHandle, profiles: tuple[MigProfile, ...], profile_id: int, placement_start: int
) -> int:
    """Create a GPU instance at a placement and one compute instance spanning it (MIG on, see
    :func:`require_enabled`); returns the GPU instance id."""
    profile = next((p for p in profiles if p.profile_id == profile_id), None)
    if profile is None:
        raise NotFoundError(f"GPU {index} has no MIG profile {profile_id}", call="nvmlDeviceGetGpuInstanceProfileInfo")
    size = next((size for start, size in profile.placements if start == placement_start), None)
    if size is None:
        raise NotFoundError(
            f"profile {profile.name} has no placement starting at memory slice {placement_start}",
            call="nvmlDeviceGetGpuInstancePossiblePlacements",
        )
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = placement_start, size
    gi = call(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
        h,
        profile_id,
        ctypes.byref(placement),
    )
    try:
        ci_profile = _full_ci_profile(gi, profile.slice_count)
        call("nvmlGpuInstanceCreateComputeInstance", pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile)
        return int(call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi).id)
    except BackendError:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlGpuInstanceDestroy(gi)  # do not leave a GPU instance without a compute instance
        raise


def destroy_instance(index: int, h: DeviceHandle, gpu_instance_id: int) -> None:
    """Destroy the GPU instance's compute instances, then the GPU instance."""
    require_enabled(index, h)
    gi = call("nvmlDeviceGetGpuInstanceById", pynvml.nvmlDeviceGetGpuInstanceById, h, gpu_instance_id)
    for ci in _compute_instances(gi):
        call("nvmlComputeInstanceDestroy", pynvml.nvmlComputeInstanceDestroy, ci)
    call("nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, gi)


def _gpu_instances(h: DeviceHandle, profile: MigProfile) -> list[GpuInstanceHandle]:
    return list_call(
        "nvmlDeviceGetGpuInstances",
        pynvml.nvmlDeviceGetGpuInstances,
        pynvml.c_nvmlGpuInstance_t,
        max(profile.instance_count, 1),
        h,
        profile.profile_id,
    )


def _ci_profiles(gi: GpuInstanceHandle) -> list[ComputeInstanceProfileInfo]:
    infos: list[ComputeInstanceProfileInfo] = []
    for const in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = skippable(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            const,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        if info is not None:
            infos.append(info)
    return infos


def _full_ci_profile(gi: GpuInstanceHandle, slices: int) -> int:
    """The compute-instance profile that spans the whole GPU instance."""
    infos = _ci_profiles(gi)
    if not infos:
        raise NotFoundError(
            "GPU instance offers no compute-instance profile", call="nvmlGpuInstanceGetComputeInstanceProfileInfo"
        )
    exact = [info for info in infos if int(info.sliceCount) == slices]
    best = exact[0] if exact else max(infos, key=lambda info: int(info.sliceCount))
    return int(best.id)


def _compute_instances(gi: GpuInstanceHandle) -> list[ComputeInstanceHandle]:
    instances: list[ComputeInstanceHandle] = []
    for info in _ci_profiles(gi):
        instances += list_call(
            "nvmlGpuInstanceGetComputeInstances",
            pynvml.nvmlGpuInstanceGetComputeInstances,
            pynvml.c_nvmlComputeInstance_t,
            max(int(info.instanceCount), 1),
            gi,
            int(info.id),
        )
    return instances


__all__ = [
    "create_instance",
    "destroy_instance",
    "list_instances",
    "mig_enabled",
    "profile_name",
    "read_profiles",
    "require_enabled",
]
