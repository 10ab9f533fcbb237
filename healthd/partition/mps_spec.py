"""What one MPS control daemon is: its card, private directories and default quota (shared by the control and the
launcher, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def mps_memory(mib: int) -> str:
    """MPS memory text: whole GiB as "2G" (the form measured on the H200), else MiB as "640M"."""
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


@dataclass(frozen=True, slots=True)
class MpsDaemonSpec:
    daemon_id: str
    gpu_uuid: str
    pipe_dir: Path
    log_dir: Path
    active_thread_percentage: int  # 0: no limit
    pinned_memory_mib: int  # 0: no limit

    def env(self) -> dict[str, str]:
        """The control daemon's environment: only its own card, its private directories."""
        return {
            "CUDA_VISIBLE_DEVICES": self.gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def default_commands(self) -> list[str]:
        """Control commands that set this partition's quota as the daemon's (client-unraisable) defaults."""
        commands = []
        if self.active_thread_percentage:
            commands.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        if self.pinned_memory_mib:
            # device 0 is the one card CUDA_VISIBLE_DEVICES leaves visible to this daemon
            commands.append(f"set_default_device_pinned_mem_limit 0 {mps_memory(self.pinned_memory_mib)}")
        return commands
