"""The Prometheus exporter-toolkit web config file (TLS and basic auth for /metrics), parsed and validated.

Same format as node_exporter's ``--web.config.file``::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hash

Options exporter-toolkit has that Python's ssl module cannot honour (Go cipher-suite names, curve preferences,
clients certificates accepted without verification) are refused with a message rather than silently ignored.
Hashes and passwords never appear in messages or logs.

PyYAML and bcrypt are imported only when a web config file is read and only when it lists basic-auth users, so a
node that configures neither (the default) runs without them; a file that needs a missing one is refused with a
message naming the package.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any


class WebConfigError(ValueError):
    """A problem in the web config file; the message starts with the option's path."""


def _missing(package: str, needed_by: str, exc: ImportError) -> WebConfigError:
    return WebConfigError(f"{needed_by}: needs the Python package {package}, which is not installed here ({exc})")


CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")  # accept unverified certs: not in ssl
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
TLS_UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}
TLS_UNSUPPORTED |= {"client_allowed_sans"}
TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    max_version: ssl.TLSVersion | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """Loads the files now (so a rotated certificate is picked up by building a new context)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        if self.max_version is not None:
            ctx.maximum_version = self.max_version
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config.cert_file/key_file: cannot load: {_reason(exc)}") from None
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(f"tls_server_config.client_ca_file: cannot load: {_reason(exc)}") from None
        ctx.verify_mode = self.client_auth
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: TlsServerConfig | None = None
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    source: str = "none"

    def __repr__(self) -> str:  # never print hashes
        return f"WebConfig(tls={self.tls!r}, basic_auth_users={sorted(self.basic_auth_users)}, source={self.source!r})"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def load_web_config(path: Path) -> WebConfig:
    """Read, parse and validate; also loads the TLS files once so a broken certificate fails here, not per request."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise WebConfigError(f"web config file {path}: {_reason(exc)}") from None
    except UnicodeDecodeError:
        raise WebConfigError(f"web config file {path}: not UTF-8 text") from None
    try:
        import yaml
    except ImportError as exc:
        raise _missing("PyYAML", f"web config file {path}", exc) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web config file {path}: not valid YAML: {exc}") from None
    config = parse_web_config({} if data is None else data, base_dir=path.parent, source=str(path))
    if config.tls is not None:
        config.tls.ssl_context()
    return config


def _path(table: Mapping[str, Any], key: str, base_dir: Path, *, required: bool) -> Path | None:
    value = table.get(key)
    if value is None or value == "":
        if required:
            raise WebConfigError(f"tls_server_config.{key}: required when tls_server_config is set")
        return None
    if not isinstance(value, str):
        raise WebConfigError(f"tls_server_config.{key}: expected a file path, got {type(value).__name__}")
    return base_dir / value  # an absolute value replaces base_dir


def _version(table: Mapping[str, Any], key: str) -> ssl.TLSVersion | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in TLS_VERSIONS:
        raise WebConfigError(f"tls_server_config.{key}: must be one of {', '.join(TLS_VERSIONS)}, got {value!r}")
    return TLS_VERSIONS[value]


def parse_tls(data: Any, base_dir: Path) -> TlsServerConfig | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise WebConfigError("tls_server_config: expected a mapping")
    for key in data:
        if key in TLS_UNSUPPORTED:
            raise WebConfigError(f"tls_server_config.{key}: not supported by xpu-healthd (use the *_file options)")
        if key not in TLS_KEYS:
            raise WebConfigError(f"tls_server_config.{key}: unknown option (known: {', '.join(sorted(TLS_KEYS))})")
    auth_name = data.get("client_auth_type", "NoClientCert")
    if auth_name in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth_name} accepts unverified certificates and is not supported; "
            "use RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
    if not isinstance(auth_name, str) or auth_name not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: must be one of {', '.join(CLIENT_AUTH_TYPES)}, got {auth_name!r}"
        )
    client_auth = CLIENT_AUTH_TYPES[auth_name]
    ca = _path(data, "client_ca_file", base_dir, required=False)
    if client_auth != ssl.CERT_NONE and ca is None:
        raise WebConfigError(f"tls_server_config.client_ca_file: required with client_auth_type {auth_name}")
    cert = _path(data, "cert_file", base_dir, required=True)
    key = _path(data, "key_file", base_dir, required=True)
    assert cert is not None
    assert key is not None
    min_version = _version(data, "min_version") or ssl.TLSVersion.TLSv1_2
    max_version = _version(data, "max_version")
    if max_version is not None and max_version < min_version:
        raise WebConfigError("tls_server_config.max_version: lower than min_version")
    return TlsServerConfig(cert, key, client_auth, ca, min_version, max_version)


def parse_basic_auth(data: Any) -> dict[str, bytes]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError("basic_auth_users: expected a mapping of user name to bcrypt hash")
    if data:
        _import_bcrypt()  # a missing bcrypt is refused when the file is loaded, not at the first scrape
    users: dict[str, bytes] = {}
    for user, hashed in data.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: invalid user name {user!r} (non-empty, no ':')")
        if not isinstance(hashed, str) or not _looks_like_bcrypt(hashed):
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash (expected $2a$, $2b$ or $2y$ ...)")
        users[user] = hashed.encode()
    return users


def _looks_like_bcrypt(value: str) -> bool:
    """``$2b$12$`` + 53 characters of bcrypt's base64; checked without ever echoing the value."""
    if len(value) != 60 or value[:4] not in ("$2a$", "$2b$", "$2y$") or value[6] != "$":
        return False
    if not value[4:6].isdecimal() or not 4 <= int(value[4:6]) <= 31:
        return False
    alphabet = set("./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
    return set(value[7:]) <= alphabet


def parse_web_config(data: Any, *, base_dir: Path, source: str = "web config") -> WebConfig:
    if not isinstance(data, dict):
        raise WebConfigError(f"web config {source}: expected a mapping at the top level")
    for key in data:
        if key not in TOP_KEYS:
            raise WebConfigError(f"{key}: unknown option (known: {', '.join(sorted(TOP_KEYS))})")
    http_server = data.get("http_server_config")
    if http_server not in (None, {}):
        raise WebConfigError("http_server_config: not supported by xpu-healthd (HTTP/1.1 only, no extra headers)")
    return WebConfig(parse_tls(data.get("tls_server_config"), base_dir), parse_basic_auth(data.get("basic_auth_users")))


def _import_bcrypt() -> ModuleType:
    try:
        import bcrypt
    except ImportError as exc:
        raise _missing("bcrypt", "basic_auth_users", exc) from None
    return bcrypt


class BasicAuthenticator:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes.

    bcrypt is slow on purpose (tens of ms); Prometheus sends the same credentials every scrape, so a successful
    check is remembered by a keyed digest of (user, password, hash); failures are never cached. An unknown user
    costs a bcrypt check too, so timing does not reveal which users exist.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._key = hashlib.sha256(repr(sorted(self._users.items())).encode()).digest()
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()
        self._dummy = b""
        if self._users:
            bcrypt = _import_bcrypt()
            self._dummy = bcrypt.hashpw(b"unused", bcrypt.gensalt(rounds=10))

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not self._users:
            return True
        credentials = _decode_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        digest = hmac.new(self._key, f"{user}\0{password}".encode() + (hashed or b""), hashlib.sha256).digest()
        with self._lock:
            if digest in self._ok:
                return hashed is not None
        try:
            ok = _import_bcrypt().checkpw(password.encode(), hashed if hashed is not None else self._dummy)
        except ValueError:
            ok = False
        if ok and hashed is not None:
            with self._lock:
                if len(self._ok) > 1024:
                    self._ok.clear()
                self._ok.add(digest)
            return True
        return False


def _decode_basic(header: str | None) -> tuple[str, str] | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None
