"""Daemon configuration: one TOML file, command-line flags on top, validated with messages that name the option."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/xpu-runtime-kit/healthd.toml")
DEFAULT_STATE_DIR = Path("/var/lib/xpu-runtime-kit")
DEFAULT_RUNTIME_DIR = Path("/run/xpu-runtime-kit")
DEFAULT_METRICS_LISTEN = ":9410"


def default_socket_path() -> Path:
    """systemd's RuntimeDirectory when set, else /run/xpu-runtime-kit."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    return (Path(runtime.split(":")[0]) if runtime else DEFAULT_RUNTIME_DIR) / "healthd.sock"


def default_grpc_listen() -> str:
    return f"unix:{default_socket_path()}"


class ConfigError(ValueError):
    """A configuration problem; the message starts with the option's name."""


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    interval_seconds: float = 5.0
    call_deadline_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """[transport]: who may reach the gRPC API and /metrics (see packaging/healthd.toml)."""

    grpc_socket_group: str = "xpu"  # "" keeps the daemon's own group
    grpc_socket_mode: int = 0o660
    grpc_tls_cert_file: Path | None = None  # TCP gRPC listeners need all three (mTLS)
    grpc_tls_key_file: Path | None = None
    grpc_tls_client_ca_file: Path | None = None
    metrics_web_config_file: Path | None = None  # Prometheus exporter-toolkit web config (TLS, basic auth)


@dataclass(frozen=True, slots=True)
class Config:
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    grpc_listen: tuple[str, ...] = ()  # empty: the default unix socket
    state_dir: Path = DEFAULT_STATE_DIR
    simulate: str | None = None  # scenario name or file; None: real GPUs
    log_level: str = "info"
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    source: str = "defaults"  # where the settings came from, for messages

    @property
    def grpc_addresses(self) -> tuple[str, ...]:
        return self.grpc_listen or (default_grpc_listen(),)


LOG_LEVELS = ("debug", "info", "warning", "error")


def load_config(path: Path | None) -> Config:
    """Read and validate a config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except PermissionError:
        raise ConfigError(f"config file {path}: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    return parse_config(data, source=str(path))


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        name = unknown[0] if unknown[0].isidentifier() else repr(unknown[0])
        raise ConfigError(f"{prefix}{name}: unknown option (known: {', '.join(sorted(allowed))})")


def _number(table: Mapping[str, Any], key: str, where: str, default: float, *, minimum: float, maximum: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key}: expected a number, got {type(value).__name__}")
    if not minimum <= float(value) <= maximum:
        raise ConfigError(f"{where}.{key}: must be between {minimum:g} and {maximum:g}, got {value}")
    return float(value)


def _string(table: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}{key}: expected a string, got {type(value).__name__}")
    return value


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> Config:
    from exporter.http import parse_listen_address  # local import keeps config importable on its own

    _check_keys(data, {"daemon", "sampler", "transport"}, "")
    daemon = data.get("daemon", {})
    sampler = data.get("sampler", {})
    for name, table in (("daemon", daemon), ("sampler", sampler)):
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: expected a table ([{name}])")
    _check_keys(daemon, {"metrics_listen", "grpc_listen", "state_dir", "simulate", "log_level"}, "daemon")
    _check_keys(sampler, {"interval_seconds", "call_deadline_seconds"}, "sampler")

    metrics_listen = _string(daemon, "metrics_listen", "daemon.", DEFAULT_METRICS_LISTEN)
    try:
        parse_listen_address(metrics_listen)
    except ValueError as exc:
        raise ConfigError(f"daemon.metrics_listen: {exc}") from None
    grpc_raw = daemon.get("grpc_listen", [])
    if isinstance(grpc_raw, str):
        grpc_raw = [grpc_raw]
    if not isinstance(grpc_raw, list) or not all(isinstance(a, str) for a in grpc_raw):
        raise ConfigError("daemon.grpc_listen: expected a string or a list of strings")
    for address in grpc_raw:
        check_grpc_address(address, "daemon.grpc_listen")
    state_dir = _string(daemon, "state_dir", "daemon.", str(DEFAULT_STATE_DIR))
    if not state_dir or not Path(state_dir).is_absolute():
        raise ConfigError(f"daemon.state_dir: must be an absolute path, got {state_dir!r}")
    simulate = daemon.get("simulate")
    if simulate == "":  # "" means real GPUs, as if unset
        simulate = None
    if simulate is not None and not isinstance(simulate, str):
        raise ConfigError("daemon.simulate: expected a scenario name or file path")
    log_level = _string(daemon, "log_level", "daemon.", "info").lower()
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"daemon.log_level: must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")

    interval = _number(sampler, "interval_seconds", "sampler", 5.0, minimum=0.1, maximum=3600)
    deadline = _number(sampler, "call_deadline_seconds", "sampler", 2.0, minimum=0.05, maximum=600)
    return Config(
        metrics_listen=metrics_listen,
        grpc_listen=tuple(grpc_raw),
        state_dir=Path(state_dir),
        simulate=simulate,
        log_level=log_level,
        sampler=SamplerSettings(interval_seconds=interval, call_deadline_seconds=deadline),
        transport=parse_transport(data.get("transport", {})),
        source=source,
    )


def _optional_path(table: Mapping[str, Any], key: str, where: str) -> Path | None:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: expected a file path (string), got {type(value).__name__}")
    if value and not value.startswith("/"):
        raise ConfigError(f"{where}.{key}: must be an absolute path, got {value!r}")
    return Path(value) if value else None


def parse_transport(table: Any) -> TransportSettings:
    if not isinstance(table, dict):
        raise ConfigError("transport: expected a table ([transport])")
    names = {f.name for f in fields(TransportSettings)}
    _check_keys(table, names, "transport")
    group = _string(table, "grpc_socket_group", "transport.", "xpu")
    if group and (not group.isprintable() or ":" in group or len(group) > 64):
        raise ConfigError(f"transport.grpc_socket_group: not a valid group name: {group!r}")
    raw_mode = table.get("grpc_socket_mode", "0660")
    if isinstance(raw_mode, int) and not isinstance(raw_mode, bool) and 0 <= raw_mode <= 0o777:
        raw_mode = f"{raw_mode:04o}"  # TOML 0o660
    if not (isinstance(raw_mode, str) and 3 <= len(raw_mode) <= 4 and all(c in "01234567" for c in raw_mode)):
        raise ConfigError(f'transport.grpc_socket_mode: expected an octal mode such as "0660", got {raw_mode!r}')
    mode_text = raw_mode
    mode = int(mode_text, 8)
    if mode & 0o007:
        raise ConfigError(
            f"transport.grpc_socket_mode: {mode_text} gives every local user access to the API; "
            "use 0660 and put the callers in grpc_socket_group"
        )
    if not mode & 0o600 == 0o600:
        raise ConfigError(f"transport.grpc_socket_mode: {mode_text} must let the owner read and write (0600 bits)")
    return TransportSettings(
        grpc_socket_group=group,
        grpc_socket_mode=mode,
        grpc_tls_cert_file=_optional_path(table, "grpc_tls_cert_file", "transport"),
        grpc_tls_key_file=_optional_path(table, "grpc_tls_key_file", "transport"),
        grpc_tls_client_ca_file=_optional_path(table, "grpc_tls_client_ca_file", "transport"),
        metrics_web_config_file=_optional_path(table, "metrics_web_config_file", "transport"),
    )


def check_grpc_address(address: str, option: str) -> None:
    """``unix:/abs/path`` or ``HOST:PORT``."""
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        if not path.startswith("/"):
            raise ConfigError(f"{option}: unix socket path must be absolute, got {address!r}")
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{option}: expected unix:/path or HOST:PORT, got {address!r}")


def with_overrides(config: Config, **overrides: Any) -> Config:
    """Apply command-line values that were given (None means not given)."""
    names = {f.name for f in fields(Config)}
    given = {k: v for k, v in overrides.items() if v is not None and k in names}
    return replace(config, **given)
