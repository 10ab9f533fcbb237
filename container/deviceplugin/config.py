"""xpu-device-plugin settings: command-line flags plus an optional TOML file, checked with messages that name the
option."""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_HEALTHD_SOCKET = "unix:/run/xpu-runtime-kit/healthd.sock"
DEFAULT_DOMAIN = "xpu-runtime-kit.io"
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
RUNTIME_ANSWERS = ("cdi", "device-nodes")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_MEMORY = re.compile(r"^(\d+)\s*(GiB|MiB)$")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TdmShape:
    """A TDM slice size offered as its own resource, e.g. 25 % and 32 GiB -> ``tdm-25c.32gib``."""

    compute_percent: int
    memory_mib: int

    @property
    def suffix(self) -> str:
        memory = f"{self.memory_mib // 1024}gib" if self.memory_mib % 1024 == 0 else f"{self.memory_mib}mib"
        return f"tdm-{self.compute_percent}c.{memory}"

    @property
    def memory(self) -> str:
        return f"{self.memory_mib}MiB"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    healthd_socket: str = DEFAULT_HEALTHD_SOCKET  # the daemon's monitoring socket (reads)
    admin_socket: str = ""  # partition changes; empty: healthd-admin.sock beside healthd_socket
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    domain: str = DEFAULT_DOMAIN  # resource names are <domain>/gpu, <domain>/mig-<profile>, <domain>/tdm-...
    whole_cards: bool = True
    mig: bool = True
    mig_profiles: tuple[str, ...] = ()  # empty: every profile the cards report, except media (+me) ones
    tdm_shapes: tuple[TdmShape, ...] = ()
    lease_seconds: float = 120.0  # a partition made in Allocate lives this long unless kubelet lists its pod
    refresh_seconds: float = 5.0  # capacity and partitions are read again this often (and after each change)
    socket_check_seconds: float = 1.0  # how often kubelet's socket and ours are checked (kubelet restarts)
    call_timeout_seconds: float = 10.0  # per call to the daemon
    daemon_grace_seconds: float = 30.0  # this long without an answer from the daemon: every device Unhealthy
    stream_grace_seconds: float = 5.0  # registered, but no ListAndWatch stream from kubelet this long: register again
    allocate_deadline_seconds: float = 25.0  # Allocate's own bound (kubelet gives none); covers a MIG create
    probe_timeout_seconds: float = 3.0  # the daemon read that opens a slice Allocate (a frozen daemon fails here)
    runtime: str = "cdi"  # "cdi": CDI device names; "device-nodes": nodes, mounts and env, for runtimes without CDI
    cdi_spec_dir: Path = DEFAULT_CDI_SPEC_DIR  # where the daemon writes its CDI spec (read for "device-nodes")

    @property
    def admin_address(self) -> str:
        if self.admin_socket:
            return self.admin_socket
        return "unix:" + str(Path(self.healthd_socket.removeprefix("unix:")).parent / "healthd-admin.sock")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpu-device-plugin",
        description="Kubelet device plugin for xpu-healthd: whole GPUs, MIG slices and TDM slices.",
    )
    p.add_argument(
        "--healthd-socket", metavar="unix:PATH", help=f"xpu-healthd's socket (default {DEFAULT_HEALTHD_SOCKET})"
    )
    p.add_argument("--admin-socket", metavar="unix:PATH", help="xpu-healthd's admin socket (default: beside it)")
    p.add_argument("--kubelet-dir", type=Path, metavar="DIR", help=f"device-plugins directory ({DEFAULT_KUBELET_DIR})")
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file (see docs/kubernetes.md)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    return p


def _number(table: dict[str, Any], key: str, where: str, default: float, low: float, high: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{where}.{key}: expected a number between {low:g} and {high:g}, got {value!r}")
    return float(value)


def _flag(table: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _keys(table: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown option (known: {', '.join(sorted(allowed))})")
    return table


def parse_shape(raw: Any, where: str) -> TdmShape:
    table = _keys(raw, {"compute_percent", "memory"}, where)
    compute = table.get("compute_percent")
    if isinstance(compute, bool) or not isinstance(compute, int) or not 1 <= compute <= 100:
        raise ConfigError(f"{where}.compute_percent: expected an integer 1-100, got {compute!r}")
    match = _MEMORY.match(str(table.get("memory", "")).strip())
    if not match:
        raise ConfigError(f'{where}.memory: expected e.g. "32GiB" or "1536MiB", got {table.get("memory")!r}')
    mib = int(match.group(1)) * (1024 if match.group(2) == "GiB" else 1)
    if mib == 0 or mib % 128:
        raise ConfigError(f"{where}.memory: must be a positive multiple of 128 MiB, got {mib} MiB")
    return TdmShape(compute, mib)


def parse_file(data: dict[str, Any], base: PluginConfig) -> PluginConfig:
    top = _keys(data, {"domain", "whole_cards", "mig", "tdm", "partitions", "daemon", "kubelet", "runtime"}, "config")
    domain = top.get("domain", base.domain)
    if not isinstance(domain, str) or not _DOMAIN.match(domain):
        raise ConfigError(f"domain: expected a DNS domain such as {DEFAULT_DOMAIN}, got {domain!r}")
    mig = _keys(top.get("mig", {}), {"enabled", "profiles"}, "mig")
    profiles = mig.get("profiles", [])
    if not isinstance(profiles, list) or not all(isinstance(x, str) and x for x in profiles):
        raise ConfigError('mig.profiles: expected a list of profile names such as ["1g.18gb", "3g.71gb"]')
    tdm = _keys(top.get("tdm", {}), {"shapes"}, "tdm")
    raw_shapes = tdm.get("shapes", [])
    if not isinstance(raw_shapes, list):
        raise ConfigError('tdm.shapes: expected a list of tables such as {compute_percent = 25, memory = "32GiB"}')
    shapes = tuple(parse_shape(s, f"tdm.shapes[{i}]") for i, s in enumerate(raw_shapes))
    if len({s.suffix for s in shapes}) != len(shapes):
        raise ConfigError("tdm.shapes: a shape is listed twice")
    parts = _keys(top.get("partitions", {}), {"lease_seconds", "refresh_seconds"}, "partitions")
    daemon = _keys(top.get("daemon", {}), {"grace_seconds", "allocate_deadline_seconds"}, "daemon")
    kubelet = _keys(top.get("kubelet", {}), {"stream_grace_seconds"}, "kubelet")
    runtime = _keys(top.get("runtime", {}), {"answer", "cdi_spec_dir"}, "runtime")
    answer = runtime.get("answer", base.runtime)
    if answer not in RUNTIME_ANSWERS:
        raise ConfigError(f"runtime.answer: expected one of {', '.join(RUNTIME_ANSWERS)}, got {answer!r}")
    spec_dir = runtime.get("cdi_spec_dir", str(base.cdi_spec_dir))
    if not isinstance(spec_dir, str) or not spec_dir.startswith("/"):
        raise ConfigError(f"runtime.cdi_spec_dir: expected an absolute path, got {spec_dir!r}")
    refresh = _number(parts, "refresh_seconds", "partitions", base.refresh_seconds, 0.2, 3600)
    grace = _number(daemon, "grace_seconds", "daemon", base.daemon_grace_seconds, 1, 3600)
    if grace < refresh:
        raise ConfigError(
            f"daemon.grace_seconds: must be at least partitions.refresh_seconds ({refresh:g}), got {grace:g}"
        )
    return PluginConfig(
        healthd_socket=base.healthd_socket,
        admin_socket=base.admin_socket,
        kubelet_dir=base.kubelet_dir,
        domain=domain,
        whole_cards=_flag(top, "whole_cards", "config", base.whole_cards),
        mig=_flag(mig, "enabled", "mig", base.mig),
        mig_profiles=tuple(profiles),
        tdm_shapes=shapes,
        lease_seconds=_number(parts, "lease_seconds", "partitions", base.lease_seconds, 10, 86400),
        refresh_seconds=refresh,
        daemon_grace_seconds=grace,
        allocate_deadline_seconds=_number(
            daemon, "allocate_deadline_seconds", "daemon", base.allocate_deadline_seconds, 1, 600
        ),
        stream_grace_seconds=_number(kubelet, "stream_grace_seconds", "kubelet", base.stream_grace_seconds, 1, 600),
        runtime=answer,
        cdi_spec_dir=Path(spec_dir),
    )


def load(args: argparse.Namespace) -> PluginConfig:
    for flag, value in (("--healthd-socket", args.healthd_socket), ("--admin-socket", args.admin_socket)):
        if value is not None and not value.startswith("unix:/"):
            raise ConfigError(f"{flag}: expected unix:/absolute/path, got {value!r}")
    base = PluginConfig(
        healthd_socket=args.healthd_socket or DEFAULT_HEALTHD_SOCKET,
        admin_socket=args.admin_socket or "",
        kubelet_dir=args.kubelet_dir or DEFAULT_KUBELET_DIR,
    )
    if args.config is None:
        return base
    try:
        data = tomllib.loads(args.config.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {args.config}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {args.config}: not valid TOML: {exc}") from None
    return parse_file(data, base)
