"""Transport security from the [transport] settings: mTLS for TCP gRPC, socket ownership, the /metrics web config.

Checked at start and by ``--check-config``, so a missing or broken certificate is reported with the option's name
before anything listens.
"""

from __future__ import annotations

import grp
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import structlog

from exporter.webconfig import WebConfig, WebConfigError, load_web_config
from healthd.config import Config, ConfigError, TransportSettings

log = structlog.get_logger("transport")


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


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None


def load_grpc_tls(settings: TransportSettings, tcp_addresses: list[str]) -> GrpcTls | None:
    """The mTLS material when a TCP listener is configured; ConfigError naming the option when it is incomplete."""
    if not tcp_addresses:
        return None
    files = {
        "transport.grpc_tls_cert_file": settings.grpc_tls_cert_file,
        "transport.grpc_tls_key_file": settings.grpc_tls_key_file,
        "transport.grpc_tls_client_ca_file": settings.grpc_tls_client_ca_file,
    }
    for option, path in files.items():
        if path is None:
            raise ConfigError(
                f"daemon.grpc_listen: TCP listener {tcp_addresses[0]} needs mTLS, but {option} is not set "
                "(set grpc_tls_cert_file, grpc_tls_key_file and grpc_tls_client_ca_file in [transport])"
            )
    cert_path, key_path, ca_path = (p for p in files.values() if p is not None)
    cert, key, ca = (
        _read(cert_path, "transport.grpc_tls_cert_file"),
        _read(key_path, "transport.grpc_tls_key_file"),
        _read(ca_path, "transport.grpc_tls_client_ca_file"),
    )
    # grpc reports bad PEM only as a failed bind; check with the ssl module first for a message that names the file
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"transport.grpc_tls_cert_file/grpc_tls_key_file: not a matching PEM certificate and key: {exc.reason}"
        ) from None
    try:
        ctx.load_verify_locations(cadata=ca.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"transport.grpc_tls_client_ca_file: not a PEM CA certificate: {exc}") from None
    return GrpcTls(cert, key, ca)


def load_metrics_web_config(settings: TransportSettings) -> WebConfig | None:
    path = settings.metrics_web_config_file
    if path is None:
        return None
    try:
        return load_web_config(path)
    except WebConfigError as exc:
        raise ConfigError(f"transport.metrics_web_config_file: {exc}") from None


def check_transport(config: Config) -> None:
    """Everything --check-config can verify about transport security without binding anything."""
    load_grpc_tls(config.transport, [a for a in config.grpc_addresses if is_tcp(a)])
    load_metrics_web_config(config.transport)


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
