"""Daemon configuration: one TOML file, command-line flags on top, validated with messages that name the option."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from healthd.probes.config import ProbeSettings, parse_probe_settings

DEFAULT_CONFIG_PATH = Path("/etc/xpu-runtime-kit/healthd.toml")
DEFAULT_STATE_DIR = Path("/var/lib/xpu-runtime-kit")
DEFAULT_RUNTIME_DIR = Path("/run/xpu-runtime-kit")
DEFAULT_METRICS_LISTEN = ":9410"
DEFAULT_NFD_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/xpu-runtime-kit"
DEFAULT_LABEL_NAMESPACE = "xpu.feature.node.kubernetes.io"


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
    call_deadline_seconds: float = 2.0  # every driver read, by anyone (the device-access layer's read deadline)
    change_deadline_seconds: float = 20.0  # MIG instance create/destroy


@dataclass(frozen=True, slots=True)
class TopologySettings:
    enabled: bool = True
    sysfs_root: Path = Path("/sys")
    refresh_seconds: float = 3600.0
    deadline_seconds: float = 10.0
    # Written only when its directory exists (NFD installed); "" disables.
    nfd_feature_file: str = DEFAULT_NFD_FEATURE_FILE
    label_namespace: str = DEFAULT_LABEL_NAMESPACE
    network: tuple[tuple[str, str], ...] = ()  # operator-supplied levels, e.g. (("block", "b07"), ("rack", "r12"))


@dataclass(frozen=True, slots=True)
class AttributionSettings:
    """[attribution]: process and pod metrics (PID -> cgroup -> container/pod, kubelet pod-resources)."""

    process_metrics: bool = True
    pod_metrics: bool = True
    max_processes_per_gpu: int = 64
    proc_root: Path = Path("/proc")
    pod_logs_root: Path = Path("/var/log")  # kubelet's pods/ and containers/ log directories
    kubelet_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    refresh_interval_seconds: float = 10.0
    # --simulate only: serve a simulated pod-resources socket (true), or read kubelet_socket (false: a real kubelet or
    # a test double beside the simulated GPUs, as the device plugin's tests use)
    simulate_kubelet: bool = True


@dataclass(frozen=True, slots=True)
class FaultsSettings:
    """[faults]: how findings become faults (see healthd/faults/engine.py for the rules)."""

    dedup_window_seconds: float = 300.0  # repeats of an active event fault: at most one "updated" record per window
    open_after_evaluations: int = 2  # a condition must be reported this many evaluations in a row to open
    resolve_after_evaluations: int = 2  # ... and be absent this many known-status evaluations in a row to resolve
    reopen_window_seconds: float = 600.0  # back within this long after resolving: the same fault reopens
    event_quiet_seconds: float = 3600.0  # an event fault below reset_gpu resolves after this long without repeats
    escalation_reboots: int = 2  # a fatal fault seen again after this many reboots becomes replace_node (0: off)
    escalation_window_seconds: float = 7 * 86400.0
    retention_seconds: float = 30 * 86400.0  # resolved faults and records older than this are deleted
    retention_max_resolved: int = 10000
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class HookSettings:
    """[hook]: where faults that need a standby node are pushed (ReplacementHook.ReportFault)."""

    endpoints: tuple[str, ...] = ()  # unix:/path or HOST:PORT
    min_action: str = "replace_node"
    node_name: str = ""  # empty: the host name
    timeout_seconds: float = 30.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    # HOST:PORT endpoints are called with mutual TLS (unix: endpoints stay plaintext); all three files are required
    tls_ca_file: Path | None = None  # CA that signed the hook's server certificate
    tls_cert_file: Path | None = None  # this daemon's client certificate
    tls_key_file: Path | None = None
    tls_server_name: str = ""  # name to check in the hook's certificate; "" means the endpoint's host


@dataclass(frozen=True, slots=True)
class ExporterSettings:
    dcgm_compat: bool = False  # also export dcgm-exporter's default series (docs/dcgm-compat.md)
    dcgm_hostname_label: str = "hostname"  # "Hostname" for dcgm-exporter releases before 4.6.0-4.8.3


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """[partitions]: where CDI specs and MPS pipes go, how often owners are checked, the admin socket.

    Unset paths are chosen at start: runtime_dir next to the main gRPC socket, the admin socket in runtime_dir,
    cdi_dir /var/run/cdi on real GPUs and <state_dir>/cdi on a simulated node (fake devices stay out of the
    system's CDI directories).
    """

    enabled: bool = True
    cdi_dir: Path | None = None
    runtime_dir: Path | None = None  # MPS pipe and log directories live under <runtime_dir>/mps/<partition id>/
    admin_socket: Path | None = None
    admin_group: str = ""  # group allowed on the admin socket (mode 0660); empty: owner only (mode 0600)
    mps: str = "auto"  # auto: the NVIDIA binary on real GPUs, the simulated control on --simulate; nvidia; simulated
    reconcile_interval_seconds: float = 10.0
    lease_default_seconds: float = 300.0
    owner_grace_seconds: float = 60.0
    cgroup_root: Path = Path("/sys/fs/cgroup")
    # auto: the driver's libraries and binaries (found through the ld.so cache) go into every CDI device, with an
    # ldcache hook; off: the operator relies on nvidia-container-toolkit for them. Never on a simulated node.
    cdi_driver_libraries: str = "auto"
    tdm_sharing: str = "isolated"  # how a TDM card's partitions share it: isolated or shared (docs/partitioning.md)


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
    topology: TopologySettings = field(default_factory=TopologySettings)
    attribution: AttributionSettings = field(default_factory=AttributionSettings)
    faults: FaultsSettings = field(default_factory=FaultsSettings)
    hook: HookSettings = field(default_factory=HookSettings)
    health: ProbeSettings = field(default_factory=ProbeSettings)
    exporter: ExporterSettings = field(default_factory=ExporterSettings)
    partitions: PartitionSettings = field(default_factory=PartitionSettings)
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


SECTIONS = {
    "daemon",
    "sampler",
    "topology",
    "attribution",
    "faults",
    "hook",
    "health",
    "exporter",
    "partitions",
    "transport",
}


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> Config:
    from exporter.http import parse_listen_address  # local import keeps config importable on its own

    _check_keys(data, SECTIONS, "")
    daemon = data.get("daemon", {})
    sampler = data.get("sampler", {})
    exporter = data.get("exporter", {})
    for name, table in data.items():  # every section is a table ([health] = [] used to raise AttributeError)
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: expected a table ([{name}])")
    _check_keys(daemon, {"metrics_listen", "grpc_listen", "state_dir", "simulate", "log_level"}, "daemon")
    _check_keys(sampler, {"interval_seconds", "call_deadline_seconds", "change_deadline_seconds"}, "sampler")
    _check_keys(exporter, {"dcgm_compat", "dcgm_hostname_label"}, "exporter")
    dcgm_compat = exporter.get("dcgm_compat", False)
    if not isinstance(dcgm_compat, bool):
        raise ConfigError(f"exporter.dcgm_compat: expected true or false, got {type(dcgm_compat).__name__}")
    dcgm_hostname_label = exporter.get("dcgm_hostname_label", "hostname")
    if dcgm_hostname_label not in ("hostname", "Hostname"):
        raise ConfigError(
            f'exporter.dcgm_hostname_label: expected "hostname" or "Hostname", got {dcgm_hostname_label!r}'
        )

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
    change_deadline = _number(sampler, "change_deadline_seconds", "sampler", 20.0, minimum=0.05, maximum=600)
    return Config(
        metrics_listen=metrics_listen,
        grpc_listen=tuple(grpc_raw),
        state_dir=Path(state_dir),
        simulate=simulate,
        log_level=log_level,
        sampler=SamplerSettings(
            interval_seconds=interval, call_deadline_seconds=deadline, change_deadline_seconds=change_deadline
        ),
        topology=parse_topology(data.get("topology", {})),
        attribution=parse_attribution(data.get("attribution", {})),
        faults=parse_faults(data.get("faults", {})),
        hook=parse_hook(data.get("hook", {})),
        health=parse_probe_settings(data.get("health", {}), "health"),
        exporter=ExporterSettings(dcgm_compat=dcgm_compat, dcgm_hostname_label=dcgm_hostname_label),
        partitions=parse_partitions(data.get("partitions", {})),
        transport=parse_transport(data.get("transport", {})),
        source=source,
    )


def parse_topology(table: Any) -> TopologySettings:
    """The [topology] section: where to read sysfs, how often, the NFD feature file and network levels."""
    from exporter.topology.nfd import valid_label_value, valid_level_name, valid_namespace

    if not isinstance(table, dict):
        raise ConfigError("topology: expected a table ([topology])")
    keys = {"enabled", "sysfs_root", "refresh_seconds", "deadline_seconds", "nfd_feature_file", "label_namespace"}
    _check_keys(table, keys | {"network"}, "topology")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"topology.enabled: expected true or false, got {type(enabled).__name__}")
    root = _string(table, "sysfs_root", "topology.", "/sys")
    if not Path(root).is_absolute():
        raise ConfigError(f"topology.sysfs_root: must be an absolute path, got {root!r}")
    nfd = _string(table, "nfd_feature_file", "topology.", DEFAULT_NFD_FEATURE_FILE)
    if nfd and (not Path(nfd).is_absolute() or Path(nfd).name.startswith(".")):
        raise ConfigError(
            f"topology.nfd_feature_file: must be an absolute path to a file not starting with '.', got {nfd!r}"
        )
    namespace = _string(table, "label_namespace", "topology.", DEFAULT_LABEL_NAMESPACE)
    if not valid_namespace(namespace):
        raise ConfigError(f"topology.label_namespace: not a DNS subdomain: {namespace!r}")
    network = table.get("network", {})
    if not isinstance(network, dict):
        raise ConfigError('topology.network: expected a table of level = value, e.g. block = "b07"')
    levels: list[tuple[str, str]] = []
    for level, value in sorted(network.items()):
        if not valid_level_name(level):
            raise ConfigError(f"topology.network.{level}: level names are lower-case letters, digits and '-'")
        if not isinstance(value, str) or not value or not valid_label_value(value):
            raise ConfigError(
                f"topology.network.{level}: expected a label value (1-63 of A-Z a-z 0-9 - _ ., alphanumeric at "
                f"both ends), got {value!r}"
            )
        levels.append((level, value))
    return TopologySettings(
        enabled=enabled,
        sysfs_root=Path(root),
        refresh_seconds=_number(table, "refresh_seconds", "topology", 3600.0, minimum=10, maximum=7 * 86400),
        deadline_seconds=_number(table, "deadline_seconds", "topology", 10.0, minimum=0.1, maximum=600),
        nfd_feature_file=nfd,
        label_namespace=namespace,
        network=tuple(levels),
    )


def parse_attribution(table: Any) -> AttributionSettings:
    where = "attribution"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([{where}])")
    d = AttributionSettings()
    _check_keys(table, {f.name for f in fields(AttributionSettings)}, where)
    flags = {}
    for key in ("process_metrics", "pod_metrics", "simulate_kubelet"):
        value = table.get(key, getattr(d, key))
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected true or false, got {type(value).__name__}")
        flags[key] = value
    cap = table.get("max_processes_per_gpu", d.max_processes_per_gpu)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= 10000:
        raise ConfigError(f"{where}.max_processes_per_gpu: expected an integer between 1 and 10000, got {cap!r}")
    paths = {}
    for key in ("proc_root", "pod_logs_root", "kubelet_socket"):
        raw = _string(table, key, f"{where}.", str(getattr(d, key)))
        if not raw.startswith("/"):
            raise ConfigError(f"{where}.{key}: must be an absolute path, got {raw!r}")
        paths[key] = Path(raw)
    refresh = _number(table, "refresh_interval_seconds", where, d.refresh_interval_seconds, minimum=0.5, maximum=3600)
    return AttributionSettings(
        process_metrics=flags["process_metrics"],
        pod_metrics=flags["pod_metrics"],
        max_processes_per_gpu=cap,
        proc_root=paths["proc_root"],
        pod_logs_root=paths["pod_logs_root"],
        kubelet_socket=paths["kubelet_socket"],
        refresh_interval_seconds=refresh,
        simulate_kubelet=flags["simulate_kubelet"],
    )


def _integer(table: Mapping[str, Any], key: str, where: str, default: int, *, minimum: int, maximum: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}.{key}: must be between {minimum} and {maximum}, got {value}")
    return value


def parse_faults(table: Mapping[str, Any]) -> FaultsSettings:
    d = FaultsSettings()
    _check_keys(table, {f.name for f in fields(FaultsSettings)}, "faults")
    boot_id_path = _string(table, "boot_id_path", "faults.", str(d.boot_id_path))
    if not Path(boot_id_path).is_absolute():
        raise ConfigError(f"faults.boot_id_path: must be an absolute path, got {boot_id_path!r}")
    day = 86400.0
    return FaultsSettings(
        dedup_window_seconds=_number(
            table, "dedup_window_seconds", "faults", d.dedup_window_seconds, minimum=0, maximum=day
        ),
        open_after_evaluations=_integer(
            table, "open_after_evaluations", "faults", d.open_after_evaluations, minimum=1, maximum=100
        ),
        resolve_after_evaluations=_integer(
            table, "resolve_after_evaluations", "faults", d.resolve_after_evaluations, minimum=1, maximum=100
        ),
        reopen_window_seconds=_number(
            table, "reopen_window_seconds", "faults", d.reopen_window_seconds, minimum=0, maximum=day
        ),
        event_quiet_seconds=_number(
            table, "event_quiet_seconds", "faults", d.event_quiet_seconds, minimum=1, maximum=30 * day
        ),
        escalation_reboots=_integer(
            table, "escalation_reboots", "faults", d.escalation_reboots, minimum=0, maximum=100
        ),
        escalation_window_seconds=_number(
            table, "escalation_window_seconds", "faults", d.escalation_window_seconds, minimum=60, maximum=365 * day
        ),
        retention_seconds=_number(
            table, "retention_seconds", "faults", d.retention_seconds, minimum=3600, maximum=3650 * day
        ),
        retention_max_resolved=_integer(
            table, "retention_max_resolved", "faults", d.retention_max_resolved, minimum=1, maximum=10_000_000
        ),
        boot_id_path=Path(boot_id_path),
    )


HOOK_ACTIONS = ("restart_app", "reset_gpu", "reboot_node", "replace_node")


def parse_hook(table: Any) -> HookSettings:
    if not isinstance(table, dict):
        raise ConfigError("hook: expected a table ([hook])")
    d = HookSettings()
    _check_keys(table, {f.name for f in fields(HookSettings)}, "hook")
    raw = table.get("endpoints", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ConfigError("hook.endpoints: expected a string or a list of strings")
    for address in raw:
        check_grpc_address(address, "hook.endpoints")
    if len(set(raw)) != len(raw):
        raise ConfigError("hook.endpoints: an endpoint is listed twice")
    min_action = _string(table, "min_action", "hook.", d.min_action).lower()
    if min_action not in HOOK_ACTIONS:
        raise ConfigError(f"hook.min_action: must be one of {', '.join(HOOK_ACTIONS)}, got {min_action!r}")
    initial = _number(table, "backoff_initial_seconds", "hook", d.backoff_initial_seconds, minimum=0.01, maximum=3600)
    maximum = _number(table, "backoff_max_seconds", "hook", d.backoff_max_seconds, minimum=0.01, maximum=86400)
    if maximum < initial:
        raise ConfigError(f"hook.backoff_max_seconds: must be at least backoff_initial_seconds ({initial:g})")
    return HookSettings(
        endpoints=tuple(raw),
        min_action=min_action,
        node_name=_string(table, "node_name", "hook.", d.node_name),
        timeout_seconds=_number(table, "timeout_seconds", "hook", d.timeout_seconds, minimum=0.1, maximum=3600),
        backoff_initial_seconds=initial,
        backoff_max_seconds=maximum,
        tls_ca_file=_optional_path(table, "tls_ca_file", "hook"),
        tls_cert_file=_optional_path(table, "tls_cert_file", "hook"),
        tls_key_file=_optional_path(table, "tls_key_file", "hook"),
        tls_server_name=_string(table, "tls_server_name", "hook.", d.tls_server_name),
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


PARTITION_KEYS = {
    "enabled",
    "cdi_dir",
    "runtime_dir",
    "admin_socket",
    "admin_group",
    "mps",
    "reconcile_interval_seconds",
    "lease_default_seconds",
    "owner_grace_seconds",
    "cgroup_root",
    "cdi_driver_libraries",
    "tdm_sharing",
}


def parse_partitions(table: Any) -> PartitionSettings:
    if not isinstance(table, dict):
        raise ConfigError("partitions: expected a table ([partitions])")
    _check_keys(table, PARTITION_KEYS, "partitions")
    d = PartitionSettings()

    def path(key: str) -> Path | None:
        if key not in table:
            return None
        value = _string(table, key, "partitions.", "")
        if not Path(value).is_absolute():
            raise ConfigError(f"partitions.{key}: must be an absolute path, got {value!r}")
        return Path(value)

    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError("partitions.enabled: expected true or false")
    admin_group = _string(table, "admin_group", "partitions.", "")
    if admin_group:
        import grp

        try:
            grp.getgrnam(admin_group)
        except KeyError:
            raise ConfigError(f"partitions.admin_group: no group named {admin_group!r} on this host") from None
    mps = _string(table, "mps", "partitions.", "auto")
    if mps not in ("auto", "nvidia", "simulated"):
        raise ConfigError(f"partitions.mps: must be auto, nvidia or simulated, got {mps!r}")
    driver_libraries = _string(table, "cdi_driver_libraries", "partitions.", "auto")
    if driver_libraries not in ("auto", "off"):
        raise ConfigError(f"partitions.cdi_driver_libraries: must be auto or off, got {driver_libraries[:100]!r}")
    sharing = _string(table, "tdm_sharing", "partitions.", "isolated")
    if sharing not in ("isolated", "shared"):
        raise ConfigError(f"partitions.tdm_sharing: must be isolated or shared, got {sharing[:100]!r}")
    return PartitionSettings(
        enabled=enabled,
        cdi_dir=path("cdi_dir"),
        runtime_dir=path("runtime_dir"),
        admin_socket=path("admin_socket"),
        admin_group=admin_group,
        mps=mps,
        reconcile_interval_seconds=_number(
            table, "reconcile_interval_seconds", "partitions", 10.0, minimum=0.1, maximum=3600
        ),
        lease_default_seconds=_number(table, "lease_default_seconds", "partitions", 300.0, minimum=1, maximum=86400),
        owner_grace_seconds=_number(table, "owner_grace_seconds", "partitions", 60.0, minimum=0, maximum=3600),
        cgroup_root=path("cgroup_root") or d.cgroup_root,
        cdi_driver_libraries=driver_libraries,
        tdm_sharing=sharing,
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
