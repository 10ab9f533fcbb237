"""[faults] and [hook]: how findings become faults, and where faults that need a standby node are pushed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exporter.settings import ConfigError, option
from healthd.rpc.addresses import check_grpc_addresses
from healthd.rpc.transport import HookClientTls, is_tcp, load_pem_files

DAY = 86400.0
HOOK_ACTIONS = ("restart_app", "reset_gpu", "reboot_node", "replace_node")


@dataclass(frozen=True, slots=True)
class FaultsSettings:
    """[faults]: see healthd/faults/engine.py for the rules."""

    dedup_window_seconds: float = option(300.0, min=0, max=DAY)  # repeats of an active event fault: one record
    open_after_evaluations: int = option(2, min=1, max=100)  # a condition reported this many times in a row opens
    resolve_after_evaluations: int = option(2, min=1, max=100)  # ... and absent this many times in a row resolves
    reopen_window_seconds: float = option(600.0, min=0, max=DAY)  # back within this long: the same fault reopens
    event_quiet_seconds: float = option(3600.0, min=1, max=30 * DAY)  # an event fault below reset_gpu resolves
    escalation_reboots: int = option(2, min=0, max=100)  # seen again after this many reboots: replace_node (0: off)
    escalation_window_seconds: float = option(7 * DAY, min=60, max=365 * DAY)
    retention_seconds: float = option(30 * DAY, min=3600, max=3650 * DAY)  # resolved faults and records kept
    retention_max_resolved: int = option(10000, min=1, max=10_000_000)
    retention_max_records: int = option(100_000, min=100, max=100_000_000)  # newest records kept, whatever their age
    boot_id_path: Path = option(Path("/proc/sys/kernel/random/boot_id"), absolute=True)


def _endpoints(addresses: tuple[str, ...]) -> None:
    check_grpc_addresses(addresses)
    if len(set(addresses)) != len(addresses):
        raise ValueError("an endpoint is listed twice")


@dataclass(frozen=True, slots=True)
class HookSettings:
    """[hook]: ReplacementHook.ReportFault endpoints, called for faults whose action reaches ``min_action``."""

    endpoints: tuple[str, ...] = option((), check=_endpoints)  # unix:/path or HOST:PORT
    min_action: str = option("replace_node", choices=HOOK_ACTIONS, lower=True)
    node_name: str = ""  # empty: the host name
    timeout_seconds: float = option(30.0, min=0.1, max=3600)
    backoff_initial_seconds: float = option(1.0, min=0.01, max=3600)
    backoff_max_seconds: float = option(300.0, min=0.01, max=86400)
    # HOST:PORT endpoints are called with mutual TLS (unix: endpoints stay plaintext); all three files are required
    tls_ca_file: Path | None = option(None, absolute=True)  # CA that signed the hook's server certificate
    tls_cert_file: Path | None = option(None, absolute=True)  # this daemon's client certificate
    tls_key_file: Path | None = option(None, absolute=True)
    tls_server_name: str = ""  # name to check in the hook's certificate; "" means the endpoint's host

    def check(self) -> None:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ConfigError(
                f"hook.backoff_max_seconds: must be at least backoff_initial_seconds ({self.backoff_initial_seconds:g})"
            )


def load_hook_tls(settings: HookSettings) -> HookClientTls | None:
    """The client mTLS material when a hook endpoint is HOST:PORT; ConfigError naming the option otherwise."""
    tcp = [e for e in settings.endpoints if is_tcp(e)]
    if not tcp:
        return None
    files = {
        "hook.tls_ca_file": settings.tls_ca_file,
        "hook.tls_cert_file": settings.tls_cert_file,
        "hook.tls_key_file": settings.tls_key_file,
    }
    for name, path in files.items():
        if path is None:
            raise ConfigError(
                f"hook.endpoints: TCP endpoint {tcp[0]} is called with mTLS, but {name} is not set "
                "(set tls_ca_file, tls_cert_file and tls_key_file in [hook], or use a unix: endpoint)"
            )
    ca_path, cert_path, key_path = (p for p in files.values() if p is not None)
    cert, key, ca = load_pem_files(
        cert_path, key_path, ca_path, ("hook.tls_cert_file", "hook.tls_key_file", "hook.tls_ca_file")
    )
    return HookClientTls(ca=ca, cert_chain=cert, private_key=key, server_name=settings.tls_server_name)
