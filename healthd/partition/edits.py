"""What a container needs to use a partition: environment, mounts, device nodes and hooks (CDI containerEdits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from healthd.host.devices import DeviceNode, HostDevices
from healthd.partition.model import CardMode, PartitionRecord
from healthd.partition.mps_spec import mps_memory


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "rw")


@dataclass(frozen=True, slots=True)
class Hook:
    """An OCI hook the runtime runs; ``hook_name`` is the CDI/OCI stage (createContainer, ...)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    hooks: tuple[Hook, ...] = ()


def container_edits(
    record: PartitionRecord,
    *,
    gpu_minor: int,
    pipe_dir: Path | None,
    devices: HostDevices,
    hook_path: str | None = None,
) -> ContainerEdits:
    """``hook_path``: xpu-cdi-hook, whose ``one-partition`` verb refuses a container given two partitions (None:
    not installed, nothing refuses)."""
    hooks: tuple[Hook, ...] = ()
    if hook_path is not None:
        hooks = (Hook("createContainer", hook_path, ("xpu-cdi-hook", "one-partition", "--partition", record.id)),)
    if record.mode is CardMode.MIG:
        assert record.mig is not None
        env = {"CUDA_VISIBLE_DEVICES": record.mig.uuid}  # NVIDIA_VISIBLE_DEVICES: "void" for the spec (cdi.py)
        nodes = devices.mig_nodes(gpu_minor, record.mig.gpu_instance_id, record.mig.compute_instance_id)
        return ContainerEdits(env=env, device_nodes=nodes, hooks=hooks)
    assert pipe_dir is not None
    env = {
        "CUDA_VISIBLE_DEVICES": record.gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
    }
    # The daemon's defaults already hold these; the env states them so a client sees its quota (and can go lower).
    if record.compute_percent:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(record.compute_percent)
    if record.memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mps_memory(record.memory_mib)}"
    mounts = (Mount(str(pipe_dir), str(pipe_dir)), Mount("/dev/shm", "/dev/shm"))
    return ContainerEdits(env=env, mounts=mounts, device_nodes=devices.card_nodes(gpu_minor), hooks=hooks)
