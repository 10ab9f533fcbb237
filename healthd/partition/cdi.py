"""A CDI spec (kind xpu-runtime-kit.io/gpu) with one device per partition (and per whole card, when the writer
includes them), replaced atomically on every change.

containerd (enable_cdi), CRI-O and Podman read specs from the CDI directories (/etc/cdi, /var/run/cdi) and inject
``xpu-runtime-kit.io/gpu=<name>`` when a container asks for it. Devices of any origin (partitions, whole cards) go
in as ``(name, ContainerEdits)`` pairs; edits every device needs (the driver libraries) sit at the spec level, which
the runtime applies whenever any device of the spec is requested.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from exporter.atomic_file import write_text_atomic
from healthd.host.devices import DeviceNode
from healthd.partition.edits import ContainerEdits

CDI_KIND = "xpu-runtime-kit.io/gpu"
SPEC_FILE = "xpu-runtime-kit.io-gpu.json"


def device_name(partition_id: str) -> str:
    return f"{CDI_KIND}={partition_id}"


# The lowest cdiVersion a spec may declare, by the rule of the CDI reference library (container-device-interface,
# specs-go/version.go, MinimumRequiredVersion): 0.3.0 is the floor, and each later version is required only by the
# fields it introduced. The rules are checked newest first and the first that matches decides. A loader rejects a
# spec whose declared version is below that minimum, and an older loader rejects versions it does not know (Debian
# 12's podman 4.3.1 refuses 0.6.0), so declaring the minimum keeps the spec loadable by every engine that can use it.
_VERSION_RULES: tuple[tuple[str, str], ...] = (
    ("1.1.0", "netDevices, or intelRdt with schemata or enableMonitoring"),
    ("0.7.0", "intelRdt or additionalGids"),
    ("0.6.0", "annotations on the spec or a device, or a dot in the kind's class"),
    ("0.5.0", "a device name starting with a digit, or a deviceNode with hostPath"),
    ("0.4.0", "a mount with a type"),
)
EARLIEST_VERSION = "0.3.0"


def _all_edits(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec.get("devices", []))]


def _needs(version: str, spec: dict[str, Any]) -> bool:
    edits = _all_edits(spec)
    devices = spec.get("devices", [])
    match version:
        case "1.1.0":
            return any(
                e.get("netDevices") or any(k in (e.get("intelRdt") or {}) for k in ("schemata", "enableMonitoring"))
                for e in edits
            )
        case "0.7.0":
            return any("intelRdt" in e or e.get("additionalGids") for e in edits)
        case "0.6.0":
            _, _, cls = str(spec.get("kind", "")).partition("/")
            return bool(spec.get("annotations")) or any(d.get("annotations") for d in devices) or "." in cls
        case "0.5.0":
            digit_name = any(str(d.get("name", ""))[:1].isdigit() for d in devices)
            return digit_name or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", []))
        case "0.4.0":
            return any(m.get("type") for e in edits for m in e.get("mounts", []))
    raise ValueError(version)


def minimum_version(spec: dict[str, Any]) -> str:
    for version, _ in _VERSION_RULES:
        if _needs(version, spec):
            return version
    return EARLIEST_VERSION


def _node_json(node: DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": node.path}
    if node.major is not None:
        out["type"] = node.type
        out["major"] = node.major
        out["minor"] = node.minor if node.minor is not None else 0
        if node.file_mode is not None:
            out["fileMode"] = node.file_mode
    return out


def edits_json(edits: ContainerEdits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = [f"{k}={v}" for k, v in sorted(edits.env.items())]
    if edits.device_nodes:
        out["deviceNodes"] = [_node_json(n) for n in edits.device_nodes]
    if edits.mounts:
        out["mounts"] = [
            {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
            for m in edits.mounts
        ]
    if edits.hooks:
        out["hooks"] = [
            {"hookName": h.hook_name, "path": h.path, **({"args": list(h.args)} if h.args else {})}
            | ({"env": list(h.env)} if h.env else {})
            for h in edits.hooks
        ]
    return out


# Spec-level env of every spec, as nvidia-container-toolkit's own specs carry it (pkg/nvcdi/wrapper.go,
# GetCommonEdits): a legacy nvidia-container-runtime (its prestart hook, NVIDIA_VISIBLE_DEVICES in the container's
# env) would otherwise add the cards a second time, beside the nodes and libraries this spec gives. "void" tells it
# to add nothing; CUDA itself reads CUDA_VISIBLE_DEVICES. It overrides the same variable set by a device plugin.
LEGACY_RUNTIME_ENV = "NVIDIA_VISIBLE_DEVICES=void"


def build_spec(devices: Iterable[tuple[str, ContainerEdits]], common: ContainerEdits | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cdiVersion": EARLIEST_VERSION, "kind": CDI_KIND}
    shared = edits_json(common) if common is not None else {}
    shared["env"] = [*shared.get("env", []), LEGACY_RUNTIME_ENV]
    spec["containerEdits"] = shared
    spec["devices"] = [
        {"name": name, "containerEdits": edits_json(edits)} for name, edits in sorted(devices, key=lambda d: d[0])
    ]
    spec["cdiVersion"] = minimum_version(spec)
    return spec


class CdiWriter:
    """Writes the whole spec to a temporary file in the same directory, fsyncs it, then renames it into place.

    ``common`` holds the edits every device gets (driver libraries and their ldcache hook), set once at start.
    """

    def __init__(self, directory: Path, common: ContainerEdits | None = None) -> None:
        self.directory = directory
        self.path = directory / SPEC_FILE
        self.common = common
        self._always: Callable[[], Iterable[tuple[str, ContainerEdits]]] = tuple

    def include(self, devices: Callable[[], Iterable[tuple[str, ContainerEdits]]]) -> None:
        """Devices written with every spec besides the partitions (the whole cards, cdi_cards.py)."""
        self._always = devices

    def write(self, devices: Iterable[tuple[str, ContainerEdits]]) -> None:
        spec = build_spec([*devices, *self._always()], self.common)
        if not spec["devices"]:
            # CDI requires at least one device per spec: no partitions, no spec file
            self.path.unlink(missing_ok=True)
            return
        # compact: json's C encoder is ten times faster than its indenting one, and runtimes do not care
        write_text_atomic(self.path, json.dumps(spec, separators=(",", ":")) + "\n")
