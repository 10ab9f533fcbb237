"""What a container needs to use a partition: environment, mounts and device nodes (CDI containerEdits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from healthd.partition.model import CardMode, PartitionRecord
from healthd.partition.mps import mps_memory

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "rw")


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[str, ...] = ()


def mig_cap_minors(proc_root: Path, gpu_minor: int, gi: int, ci: int) -> tuple[int, ...]:
    """Capability device minors for a MIG device from /proc/driver/nvidia-caps/mig-minors (empty when absent)."""
    wanted = (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access")
    found: dict[str, int] = {}
    try:
        text = (proc_root / "driver/nvidia-caps/mig-minors").read_text()
    except OSError:
        return ()
    for line in text.splitlines():
        name, _, minor = line.strip().partition(" ")
        if name in wanted and minor.strip().isdigit():
            found[name] = int(minor)
    return tuple(found[n] for n in wanted if n in found)


def container_edits(
    record: PartitionRecord, *, gpu_minor: int, pipe_dir: Path | None, proc_root: Path = Path("/proc")
) -> ContainerEdits:
    nodes = [*CONTROL_NODES, f"/dev/nvidia{gpu_minor}"]
    if record.mode is CardMode.MIG:
        assert record.mig is not None
        visible = record.mig.uuid
        env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
        minors = mig_cap_minors(proc_root, gpu_minor, record.mig.gpu_instance_id, record.mig.compute_instance_id)
        nodes += [f"/dev/nvidia-caps/nvidia-cap{m}" for m in minors]
        return ContainerEdits(env=env, device_nodes=tuple(nodes))
    assert pipe_dir is not None
    env = {
        "CUDA_VISIBLE_DEVICES": record.gpu_uuid,
        "NVIDIA_VISIBLE_DEVICES": record.gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
    }
    # The daemon's defaults already hold these; the env states them so a client sees its quota (and can go lower).
    if record.compute_percent:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(record.compute_percent)
    if record.memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mps_memory(record.memory_mib)}"
    mounts = (Mount(str(pipe_dir), str(pipe_dir)), Mount("/dev/shm", "/dev/shm"))
    return ContainerEdits(env=env, mounts=mounts, device_nodes=tuple(nodes))
