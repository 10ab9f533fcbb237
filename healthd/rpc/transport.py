"""Transport security: mTLS for TCP gRPC (the daemon's listeners, its calls to the replacement hook, and the
reference hook server), socket ownership, the /metrics web config.

Checked at start and by ``--check-config``, so a missing or broken certificate is reported with the option's name
before anything listens or dials. Unix sockets stay plaintext: the kernel checks who may connect.
"""

from __future__ import annotations

import grp
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from exporter.settings import ConfigError, option
from exporter.webconfig import WebConfig, WebConfigError, load_web_config

log = structlog.get_logger("transport")


def _group(name: str) -> None:
    if name and (not name.isprintable() or ":" in name or len(name) > 64):
        raise ValueError(f"not a valid group name: {name[:100]!r}")


def _socket_mode(raw: object, name: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= 0o777:
        raw = f"{raw:04o}"  # TOML 0o660
    if not (isinstance(raw, str) and 3 <= len(raw) <= 4 and all(c in "01234567" for c in raw)):
        raise ConfigError(f'{name}: expected an octal mode such as "0660", got {str(raw)[:100]!r}')
    mode = int(raw, 8)
    if mode & 0o007:
        raise ConfigError(
            f"{name}: {raw} gives every local user access to the API; use 0660 and put the callers in grpc_socket_group"
        )
    if not mode & 0o600 == 0o600:
        raise ConfigError(f"{name}: {raw} must let the owner read and write (0600 bits)")
    return mode


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """[transport]: who may reach the gRPC API and /metrics (see packaging/healthd.toml)."""

    grpc_socket_group: str = option("xpu", check=_group)  # "" keeps the daemon's own group
    grpc_socket_mode: int = option(0o660, parse=_socket_mode)
    grpc_tls_cert_file: Path | None = option(None, absolute=True)  # TCP gRPC listeners need all three (mTLS)
    grpc_tls_key_file: Path | None = option(None, absolute=True)
    grpc_tls_client_ca_file: Path | None = option(None, absolute=True)
    # Prometheus exporter-toolkit web config (TLS, basic auth)
    metrics_web_config_file: Path | None = option(None, absolute=True)


@dataclass(frozen=True, slots=True)
class GrpcTls:
    """PEM bytes for grpc.ssl_server_credentials; client certificates are always required."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes

    def __repr__(self) -> str:  # the key must never reach a log line
        return "GrpcTls(<cert>, <key>, <client ca>)"


def is_tcp(address: str) -> bool:
    return not address.startswith("unix:")


def _read(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None


def load_grpc_tls(settings: TransportSettings, tcp_addresses: list[str]) -> GrpcTls | None:
    """The mTLS material when a TCP listener is configured; ConfigError naming the option when it is incomplete."""
    if not tcp_addresses:
        return None
    files = {
        "transport.grpc_tls_cert_file": settings.grpc_tls_cert_file,
        "transport.grpc_tls_key_file": settings.grpc_tls_key_file,
        "transport.grpc_tls_client_ca_file": settings.grpc_tls_client_ca_file,
    }
    for name, path in files.items():
        if path is None:
            raise ConfigError(
                f"daemon.grpc_listen: TCP listener {tcp_addresses[0]} needs mTLS, but {name} is not set "
                "(set grpc_tls_cert_file, grpc_tls_key_file and grpc_tls_client_ca_file in [transport])"
            )
    cert_path, key_path, ca_path = (p for p in files.values() if p is not None)
    names = ("transport.grpc_tls_cert_file", "transport.grpc_tls_key_file", "transport.grpc_tls_client_ca_file")
    cert, key, ca = load_pem_files(cert_path, key_path, ca_path, names)
    return GrpcTls(cert, key, ca)


def load_pem_files(cert_path: Path, key_path: Path, ca_path: Path, options: tuple[str, str, str]) -> tuple[bytes, ...]:
    """(certificate chain, key, CA) as PEM bytes, each checked; ConfigError names the option (or flag) at fault."""
    cert_option, key_option, ca_option = options
    cert, key, ca = _read(cert_path, cert_option), _read(key_path, key_option), _read(ca_path, ca_option)
    # grpc reports bad PEM only as a failed bind or handshake; check with the ssl module first for a message that
    # names the file
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        both = f"{cert_option}/{key_option.rpartition('.')[2]}"  # transport.grpc_tls_cert_file/grpc_tls_key_file
        raise ConfigError(f"{both}: not a matching PEM certificate and key: {exc.reason}") from None
    try:
        ctx.load_verify_locations(cadata=ca.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{ca_option}: not a PEM CA certificate: {exc}") from None
    return cert, key, ca


@dataclass(frozen=True, slots=True)
class HookClientTls:
    """What the daemon presents to, and checks in, a HOST:PORT replacement hook."""

    ca: bytes
    cert_chain: bytes
    private_key: bytes
    server_name: str = ""

    def __repr__(self) -> str:
        return f"HookClientTls(<ca>, <cert>, <key>, server_name={self.server_name!r})"


def hook_channel(target: str, tls: HookClientTls | None) -> grpc.aio.Channel:
    """A channel to one hook endpoint: plaintext on a unix socket, mutual TLS over TCP (never plaintext TCP)."""
    if not is_tcp(target):
        return grpc.aio.insecure_channel(target)
    if tls is None:
        raise ConfigError(
            f"hook.endpoints: TCP endpoint {target} needs [hook] tls_ca_file, tls_cert_file, tls_key_file"
        )
    return grpc.aio.secure_channel(target, *hook_credentials(tls))


def hook_credentials(tls: HookClientTls) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    """(credentials, channel options) for a TCP hook; for sync and asyncio channels alike."""
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.private_key, tls.cert_chain)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return credentials, options


def server_credentials(tls: GrpcTls) -> grpc.ServerCredentials:
    """Server side of mTLS: a client without a certificate signed by the CA is refused in the handshake."""
    return grpc.ssl_server_credentials(
        [(tls.private_key, tls.cert_chain)], root_certificates=tls.client_ca, require_client_auth=True
    )


def load_metrics_web_config(settings: TransportSettings) -> WebConfig | None:
    path = settings.metrics_web_config_file
    if path is None:
        return None
    try:
        return load_web_config(path)
    except WebConfigError as exc:
        raise ConfigError(f"transport.metrics_web_config_file: {exc}") from None


def socket_group_id(name: str) -> int | None:
    """The gid for the socket's group, or None (keep the default) when unset or the group does not exist."""
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        log.warning("socket group does not exist; the socket keeps the daemon's group", group=name)
        return None


def secure_socket(path: Path, mode: int, gid: int | None) -> None:
    """Mode first, then group: if the group cannot be set (not root, not a member), the socket is still 0660."""
    os.chmod(path, mode)
    if gid is not None:
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            log.warning("cannot give the socket to its group; it keeps the daemon's group", path=str(path), gid=gid)
