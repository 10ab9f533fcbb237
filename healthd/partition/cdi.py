"""A CDI spec (kind xpu-runtime-kit.io/gpu) with one device per partition (and per whole card, when the writer
includes them), replaced atomically on every change.

containerd (enable_cdi), CRI-O and Podman read specs from the CDI directories (/etc/cdi, /var/run/cdi) and inject
``xpu-runtime-kit.io/gpu=<partition id>`` when a container asks for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from exporter.atomic_file import write_text_atomic
from healthd.partition.edits import ContainerEdits

CDI_VERSION = "0.6.0"
CDI_KIND = "xpu-runtime-kit.io/gpu"
SPEC_FILE = "xpu-runtime-kit.io-gpu.json"


def device_name(partition_id: str) -> str:
    return f"{CDI_KIND}={partition_id}"


def build_spec(devices: Iterable[tuple[str, ContainerEdits]]) -> dict[str, Any]:
    out = []
    for name, edits in sorted(devices, key=lambda d: d[0]):
        container_edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(edits.env.items())]}
        if edits.device_nodes:
            container_edits["deviceNodes"] = [{"path": p} for p in edits.device_nodes]
        if edits.mounts:
            container_edits["mounts"] = [
                {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
                for m in edits.mounts
            ]
        out.append({"name": name, "containerEdits": container_edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": out}


class CdiWriter:
    """Writes the whole spec to a temporary file in the same directory, fsyncs it, then renames it into place."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / SPEC_FILE
        self._always: Callable[[], Iterable[tuple[str, ContainerEdits]]] = tuple

    def include(self, devices: Callable[[], Iterable[tuple[str, ContainerEdits]]]) -> None:
        """Devices written with every spec besides the partitions (the whole cards, cdi_cards.py)."""
        self._always = devices

    def write(self, devices: Iterable[tuple[str, ContainerEdits]]) -> None:
        spec = build_spec([*devices, *self._always()])
        if not spec["devices"]:
            # CDI requires at least one device per spec: no partitions, no spec file
            self.path.unlink(missing_ok=True)
            return
        write_text_atomic(self.path, json.dumps(spec, indent=2) + "\n")
