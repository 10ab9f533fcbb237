"""What Allocate tells the container runtime, per the ``[runtime] answer`` setting.

- ``cdi`` (default): CDI device names only; a CDI-enabled runtime (containerd 1.7+ with ``enable_cdi``, CRI-O)
  resolves them from the daemon's spec into device nodes, mounts and env.
- ``device-nodes``: for runtimes without CDI (containerd 1.6, Debian 12's, has none and ignores CDI names, so a
  pod would start with no ``/dev/nvidia*``). The plugin resolves the same CDI devices itself, reading the spec the
  daemon writes (``cdi_spec_dir``), and answers with kubelet's own DeviceSpec, Mount and env, which every runtime
  honours. CDI hooks cannot be expressed that way and are not run (the daemon's spec uses one to refresh the
  container's linker cache for the driver libraries it mounts); see docs/kubernetes.md.

The spec format followed is CDI's (cncf-tags/container-device-interface, SPEC.md: ``kind``, spec-level and
per-device ``containerEdits`` with ``env``, ``deviceNodes``, ``mounts``, ``hooks``); only JSON specs are read,
which is what xpu-healthd writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from container.deviceplugin.api.v1beta1 import api_pb2 as kpb
from container.deviceplugin.errors import AllocationError

log = structlog.get_logger("container.deviceplugin.runtime_answer")

LEGACY_RUNTIME_VAR = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Edits:
    env: Mapping[str, str]
    devices: tuple[kpb.DeviceSpec, ...]
    mounts: tuple[kpb.Mount, ...]
    hooks: tuple[str, ...]  # names of the hooks that could not be expressed


def _edits(raw: Any) -> tuple[dict[str, str], list[kpb.DeviceSpec], list[kpb.Mount], list[str]]:
    if not isinstance(raw, dict):
        return {}, [], [], []
    env = {}
    for item in raw.get("env", []) or []:
        name, sep, value = str(item).partition("=")
        if sep:
            env[name] = value
    devices = [
        kpb.DeviceSpec(
            container_path=str(n["path"]),
            host_path=str(n.get("hostPath") or n["path"]),
            permissions=str(n.get("permissions") or "rwm"),
        )
        for n in raw.get("deviceNodes", []) or []
        if isinstance(n, dict) and n.get("path")
    ]
    mounts = [
        kpb.Mount(
            container_path=str(m["containerPath"]),
            host_path=str(m["hostPath"]),
            read_only="ro" in (m.get("options") or []),
        )
        for m in raw.get("mounts", []) or []
        if isinstance(m, dict) and m.get("containerPath") and m.get("hostPath")
    ]
    hooks = [str(h.get("hookName", "?")) for h in raw.get("hooks", []) or [] if isinstance(h, dict)]
    return env, devices, mounts, hooks


def read_spec_edits(spec_dir: Path, qualified_name: str) -> Edits:
    """The edits a CDI runtime would apply for ``vendor/class=name``: the spec's own, then the device's."""
    kind, sep, name = qualified_name.partition("=")
    if not sep:
        raise AllocationError(grpc.StatusCode.INTERNAL, f"not a CDI device name: {qualified_name!r}")
    try:
        files = sorted(spec_dir.glob("*.json"))
    except OSError as exc:
        raise AllocationError(
            grpc.StatusCode.UNAVAILABLE, f"cannot read the CDI spec directory {spec_dir}: {exc}"
        ) from None
    for path in files:
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced, or not ours
        if not isinstance(spec, dict) or spec.get("kind") != kind:
            continue
        for device in spec.get("devices", []) or []:
            if isinstance(device, dict) and device.get("name") == name:
                env, devices, mounts, hooks = _edits(spec.get("containerEdits"))
                d_env, d_devices, d_mounts, d_hooks = _edits(device.get("containerEdits"))
                return Edits({**env, **d_env}, (*devices, *d_devices), (*mounts, *d_mounts), (*hooks, *d_hooks))
    raise AllocationError(
        grpc.StatusCode.UNAVAILABLE,
        f"CDI device {qualified_name} is not in the daemon's spec under {spec_dir} (yet); try again",
    )


class RuntimeAnswer:
    """Fills a ContainerAllocateResponse with the devices in the form the node's runtime understands."""

    def __init__(self, answer: str, spec_dir: Path) -> None:
        self.answer = answer
        self.spec_dir = spec_dir

    def fill(self, response: kpb.ContainerAllocateResponse, cdi_names: list[str]) -> None:
        # a legacy nvidia-container-runtime reads NVIDIA_VISIBLE_DEVICES and would add the cards a second time
        # (or every card, for an image that sets it to "all"); the daemon's spec says "void" for the same reason
        response.envs[LEGACY_RUNTIME_VAR] = "void"
        if self.answer == "cdi":
            response.cdi_devices.extend(kpb.CDIDevice(name=n) for n in cdi_names)
            return
        skipped: list[str] = []
        seen_devices: set[str] = set()
        seen_mounts: set[str] = set()
        for name in cdi_names:
            edits = read_spec_edits(self.spec_dir, name)
            for key, value in edits.env.items():
                response.envs.setdefault(key, value)  # what the plugin computed (XPU_*, CUDA_*) wins
            for device in edits.devices:
                if device.container_path not in seen_devices:
                    seen_devices.add(device.container_path)
                    response.devices.append(device)
            for mount in edits.mounts:
                if mount.container_path not in seen_mounts:
                    seen_mounts.add(mount.container_path)
                    response.mounts.append(mount)
            skipped += edits.hooks
        response.envs[LEGACY_RUNTIME_VAR] = "void"
        if skipped:
            log.debug("CDI hooks not expressible in a device-plugin answer", hooks=sorted(set(skipped)))
