"""The daemon's configuration: one TOML file of sections, each read into the settings class its subsystem declares
(exporter/settings.py does the reading), with command-line flags on top. This module only composes the sections."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from exporter.http import parse_listen_address
from exporter.sampler import SamplerSettings
from exporter.settings import ConfigError, check_keys, option, parse_section
from exporter.textfile import NotATextFile, read_text_file
from exporter.topology.settings import TopologySettings
from healthd.attribution.component import AttributionSettings
from healthd.daemon.cards import ExporterSettings
from healthd.faults.settings import FaultsSettings, HookSettings, load_hook_tls
from healthd.host.view import HostSettings
from healthd.partition.settings import PartitionSettings
from healthd.probes import HealthSettings, parse_health
from healthd.rpc.addresses import check_grpc_addresses, default_grpc_listen, default_runtime_dir
from healthd.rpc.transport import TransportSettings, is_tcp, load_grpc_tls, load_metrics_web_config

__all__ = ["DEFAULT_CONFIG_PATH", "Config", "ConfigError", "load_config", "parse_config", "with_overrides"]

DEFAULT_CONFIG_PATH = Path("/etc/xpu-runtime-kit/healthd.toml")
DEFAULT_STATE_DIR = Path("/var/lib/xpu-runtime-kit")
DEFAULT_METRICS_LISTEN = ":9410"
LOG_LEVELS = ("debug", "info", "warning", "error")


def _listen(value: str) -> None:
    parse_listen_address(value)  # ValueError says what is wrong


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """[daemon]: where it listens and keeps its state, and whether it runs on real GPUs."""

    metrics_listen: str = option(DEFAULT_METRICS_LISTEN, check=_listen)
    grpc_listen: tuple[str, ...] = option((), check=check_grpc_addresses)  # empty: the default unix socket
    # changes (partitions, resolving faults) are served here only; unset: healthd-admin.sock beside the main socket
    admin_socket: Path | None = option(None, absolute=True)
    admin_group: str = ""  # group allowed on the admin socket (mode 0660); empty: owner only (mode 0600)
    state_dir: Path = option(DEFAULT_STATE_DIR, absolute=True)
    simulate: str = ""  # a scenario name or file: a simulated node; "": real GPUs
    log_level: str = option("info", choices=LOG_LEVELS, lower=True)
    # the node's name on every fault channel (hook push, fault metrics); "": NODE_NAME, else the lower-cased host name
    node_name: str = ""

    def check(self) -> None:
        if self.admin_group:
            import grp

            try:
                grp.getgrnam(self.admin_group)
            except KeyError:
                group = self.admin_group[:64]
                raise ConfigError(f"daemon.admin_group: no group named {group!r} on this host") from None


@dataclass(frozen=True, slots=True)
class Config:
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    host: HostSettings = field(default_factory=HostSettings)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    topology: TopologySettings = field(default_factory=TopologySettings)
    attribution: AttributionSettings = field(default_factory=AttributionSettings)
    faults: FaultsSettings = field(default_factory=FaultsSettings)
    hook: HookSettings = field(default_factory=HookSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    exporter: ExporterSettings = field(default_factory=ExporterSettings)
    partitions: PartitionSettings = field(default_factory=PartitionSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    source: str = "defaults"  # where the settings came from, for messages

    # the [daemon] options, by the names the rest of the daemon uses
    @property
    def metrics_listen(self) -> str:
        return self.daemon.metrics_listen

    @property
    def state_dir(self) -> Path:
        return self.daemon.state_dir

    @property
    def simulate(self) -> str | None:
        return self.daemon.simulate or None

    @property
    def log_level(self) -> str:
        return self.daemon.log_level

    @property
    def grpc_addresses(self) -> tuple[str, ...]:
        return self.daemon.grpc_listen or (default_grpc_listen(),)

    @property
    def main_socket(self) -> Path | None:
        return next((Path(a[len("unix:") :]) for a in self.grpc_addresses if a.startswith("unix:")), None)

    @property
    def runtime_dir(self) -> Path:
        """Where the sockets live (and, unless set, the MPS pipe directories): the main socket's directory."""
        socket = self.main_socket
        return socket.parent if socket is not None else default_runtime_dir()

    @property
    def admin_socket(self) -> Path:
        return self.daemon.admin_socket or self.runtime_dir / "healthd-admin.sock"

    def check_transport(self) -> None:
        """Everything --check-config can verify about transport security without binding anything."""
        load_grpc_tls(self.transport, [a for a in self.grpc_addresses if is_tcp(a)])
        load_metrics_web_config(self.transport)
        load_hook_tls(self.hook)


SECTIONS = {f.name for f in fields(Config) if f.name != "source"}


def load_config(path: Path | None) -> Config:
    """Read and validate a config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    try:
        data = tomllib.loads(read_text_file(path))
    except NotATextFile as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: not valid TOML: nested too deeply") from None
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except PermissionError:
        raise ConfigError(f"config file {path}: permission denied") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path}: is a directory; give the file, e.g. {DEFAULT_CONFIG_PATH}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    try:
        return parse_config(data, source=str(path))
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in {path})") from None


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> Config:
    check_keys(data, SECTIONS, "")
    sections: dict[str, Any] = {}
    for f in fields(Config):
        if f.name == "source":
            continue
        table = data.get(f.name, {})
        if f.name == "health":  # one sub-table per registered probe
            sections[f.name] = parse_health(table)
        else:
            sections[f.name] = parse_section(type(getattr(DEFAULTS, f.name)), table, f.name)
    return Config(**sections, source=source)


DEFAULTS = Config()


def with_overrides(config: Config, **overrides: Any) -> Config:
    """Apply command-line values of [daemon] options that were given (None means not given)."""
    names = {f.name for f in fields(DaemonSettings)}
    given = {k: v for k, v in overrides.items() if v is not None and k in names}
    return replace(config, daemon=replace(config.daemon, **given))
