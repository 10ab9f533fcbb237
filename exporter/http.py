"""The HTTP endpoint: /metrics, /healthz and a landing page, on a server with bounded threads and connections
(exporter/http_server.py: idle or slow clients hold no thread).

/metrics serves what the exposition cache rendered from the latest Snapshot (exporter/exposition.py), so a scrape
answers at once, never calls the driver, and costs the same however often it comes.
"""

from __future__ import annotations

import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import structlog

from exporter.encoding import Collectable
from exporter.exposition import ExpositionCache
from exporter.http_server import BoundedHTTPServer, OneRequestHandler
from exporter.inflight import RequestsInFlight
from exporter.webconfig import BasicAuthenticator, WebConfig

log = structlog.get_logger("http")

DEFAULT_METRICS_PORT = 9410


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reason: str


def parse_listen_address(value: str, default_port: int = DEFAULT_METRICS_PORT) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``[::1]:PORT`` or ``HOST`` -> (host, port). Raises ValueError with the reason."""
    text = value.strip()
    if not text:
        raise ValueError("listen address is empty")
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"listen address {value!r}: unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"listen address {value!r}: expected ':PORT' after ']'")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.count(":") > 1:
        raise ValueError(f"listen address {value!r}: put IPv6 addresses in brackets, e.g. [::1]:9410")
    port = default_port
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
            raise ValueError(f"listen address {value!r}: port must be a number 0-65535")
        port = int(port_text)
    return host or "0.0.0.0", port


LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>xpu-healthd</title></head>
<body><h1>xpu-healthd</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""


class _Handler(OneRequestHandler):
    # Headers and body leave in two writes; the server turns Nagle off, or a kept-alive client (Prometheus) waits
    # for its delayed ACK (~40 ms) before the body's last segment arrives (bench/metrics_bench.py: 48 ms -> 3 ms).
    server: MetricsHTTPServer

    def do_GET(self) -> None:  # noqa: N802 (http.server dispatches on the method name)
        url = urlsplit(self.path)
        try:
            if not self.server.security().auth.check(self.headers.get("Authorization")):
                self._unauthorized()
            elif url.path == "/metrics":
                self._metrics(parse_qs(url.query))
            elif url.path == "/healthz":
                health = self.server.health()
                status = HTTPStatus.OK if health.ok else HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, "text/plain; charset=utf-8", (health.reason + "\n").encode())
            elif url.path == "/":
                page = self.server.landing()
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", page.encode())
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")
        except BrokenPipeError:
            pass
        except Exception:
            log.exception("http handler failed", path=url.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8", b"internal error\n")

    def _metrics(self, query: dict[str, list[str]]) -> None:
        payload = self.server.exposition.payload(
            self.headers.get("Accept", ""),
            self.headers.get("Accept-Encoding", ""),
            query.get("name[]"),
            client=str(self.client_address[0]),
        )
        self._send(HTTPStatus.OK, payload.content_type, payload.body, encoding=payload.encoding)

    def _unauthorized(self) -> None:
        self._send(
            HTTPStatus.UNAUTHORIZED,
            "text/plain; charset=utf-8",
            b"Unauthorized\n",
            extra={"WWW-Authenticate": 'Basic realm="xpu-healthd"'},
        )

    def _send(
        self,
        status: HTTPStatus,
        content_type: str,
        body: bytes,
        *,
        encoding: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http request", line=format % args)


@dataclass(frozen=True, slots=True)
class HttpSecurity:
    """What the web config turns into: a TLS context (or none) and a basic-auth checker; swapped as one."""

    tls: ssl.SSLContext | None
    auth: BasicAuthenticator

    @classmethod
    def from_web_config(cls, config: WebConfig | None) -> HttpSecurity:
        if config is None:
            return cls(None, BasicAuthenticator({}))
        return cls(config.tls.ssl_context() if config.tls else None, BasicAuthenticator(config.basic_auth_users))


class BindError(OSError):
    """The metrics listener could not be bound; the message names the address."""


class MetricsHTTPServer(BoundedHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        metrics: ExpositionCache | Collectable,
        health: Callable[[], Health],
        landing: Callable[[], str] = lambda: LANDING,
        web_config: WebConfig | None = None,
        requests: RequestsInFlight | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._security = HttpSecurity.from_web_config(web_config)
        try:
            super().__init__(address, _Handler, requests)
        except OSError as exc:  # "[Errno 98] Address already in use" alone does not say which address
            shown = f"[{address[0]}]:{address[1]}" if ":" in address[0] else f"{address[0]}:{address[1]}"
            error = BindError(f"cannot listen on {shown}: {exc.strerror or exc}")
            error.errno = exc.errno
            raise error from None
        # a bare registry (nothing publishes Snapshots to it) is rendered on every scrape, as it always was
        self.exposition = metrics if isinstance(metrics, ExpositionCache) else ExpositionCache(metrics, max_age=0.0)
        self.exposition.give_way_to(self.requests)  # its publish renders wait while this server answers a request
        self.health = health
        self.landing = landing

    def security(self) -> HttpSecurity:
        return self._security

    def set_web_config(self, web_config: WebConfig | None) -> None:
        """Apply a (re-read) web config to new connections; raises WebConfigError and keeps the old one on failure."""
        self._security = HttpSecurity.from_web_config(web_config)

    @property
    def scheme(self) -> str:
        return "https" if self._security.tls is not None else "http"

    def tls_context(self) -> ssl.SSLContext | None:
        """Read per connection, so a re-read web config applies to the next connection."""
        return self._security.tls

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("http client went away", client=str(client_address))
            return
        log.error("http request failed", client=str(client_address), error=repr(exc))

    @property
    def port(self) -> int:
        return int(self.server_address[1])
