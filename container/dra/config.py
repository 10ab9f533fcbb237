"""xpu-dra-driver settings: the command line (kept stable: tests outside the project drive it) and an optional TOML
file for the tunables, checked with messages that name the option."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from container.dra import names

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / names.DRIVER
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class DriverConfig:
    healthd_socket: str
    node_name: str
    admin_socket: str = ""  # empty: healthd-admin.sock beside the monitoring socket
    kubeconfig: str | None = None  # None: in-cluster credentials
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    # from --config
    fault_taint_effect: str = "NoSchedule"  # the effect of the xpu-runtime-kit.io/fault taint on a faulty card
    unmonitored_grace_seconds: float = 30.0  # the daemon unreachable this long: every device tainted unmonitored
    refresh_seconds: float = 5.0  # the daemon is read again this often (faults arrive as events in between)
    call_timeout_seconds: float = 10.0  # per call to the daemon
    health_check_timeout_seconds: int = 30  # what the health stream tells kubelet (its own default is 30 s)

    @property
    def admin_address(self) -> str:
        if self.admin_socket:
            return self.admin_socket
        return "unix:" + str(Path(self.healthd_socket.removeprefix("unix:")).parent / "healthd-admin.sock")

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{names.DRIVER}-reg.sock"

    @property
    def plugin_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / "checkpoint.json"


TUNABLES: Mapping[str, type] = MappingProxyType(
    {
        "fault_taint_effect": str,
        "unmonitored_grace_seconds": float,
        "refresh_seconds": float,
        "call_timeout_seconds": float,
        "health_check_timeout_seconds": int,
    }
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xpu-dra-driver",
        description=f"Kubernetes DRA driver {names.DRIVER}: GPUs, TDM shares and MIG instances from xpu-healthd",
    )
    parser.add_argument("--healthd-socket", required=True, metavar="unix:PATH", help="the daemon's monitoring socket")
    parser.add_argument("--admin-socket", default="", metavar="unix:PATH", help="the daemon's admin socket")
    parser.add_argument("--node-name", required=True, metavar="NAME", help="this node's name in Kubernetes")
    parser.add_argument("--kubeconfig", default=None, metavar="FILE", help="default: in-cluster credentials")
    parser.add_argument("--kubelet-registry-dir", type=Path, default=DEFAULT_REGISTRY_DIR, metavar="DIR")
    parser.add_argument("--kubelet-plugin-dir", type=Path, default=DEFAULT_PLUGIN_DIR, metavar="DIR")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE", help="TOML file of tunables")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _unix(value: str, option: str) -> str:
    if not value.startswith("unix:") or len(value) <= len("unix:"):
        raise ConfigError(f"{option}: expected unix:PATH, got {value!r}")
    return value


def _tunables(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = TUNABLES.get(key)
        if kind is None:
            raise ConfigError(f"--config {path}: unknown key {key!r} (known: {', '.join(TUNABLES)})")
        if isinstance(value, bool) or not isinstance(value, (kind, int) if kind is float else kind):
            raise ConfigError(f"--config {path}: {key} must be a {kind.__name__}, got {value!r}")
        out[key] = kind(value)
    effect = out.get("fault_taint_effect", "NoSchedule")
    if effect not in TAINT_EFFECTS:
        raise ConfigError(f"--config {path}: fault_taint_effect must be one of {', '.join(TAINT_EFFECTS)}")
    for key in ("unmonitored_grace_seconds", "refresh_seconds", "call_timeout_seconds"):
        if key in out and not 0 < out[key] <= 86400:
            raise ConfigError(f"--config {path}: {key} must be above 0 and at most 86400, got {out[key]}")
    if not 1 <= out.get("health_check_timeout_seconds", 30) <= 3600:
        raise ConfigError(f"--config {path}: health_check_timeout_seconds must be 1-3600")
    return out


def load(args: argparse.Namespace) -> DriverConfig:
    if not args.node_name or len(args.node_name) > 253:
        raise ConfigError(f"--node-name: expected a Kubernetes node name, got {args.node_name!r}")
    config = DriverConfig(
        healthd_socket=_unix(args.healthd_socket, "--healthd-socket"),
        admin_socket=_unix(args.admin_socket, "--admin-socket") if args.admin_socket else "",
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
        registry_dir=args.kubelet_registry_dir,
        plugin_dir=args.kubelet_plugin_dir,
        **(_tunables(args.config) if args.config is not None else {}),
    )
    for field in fields(config):
        if field.name.endswith("_dir") and len(str(getattr(config, field.name))) > 90:
            raise ConfigError(f"--kubelet-{field.name.replace('_', '-')}: too long for a unix socket path")
    return config
