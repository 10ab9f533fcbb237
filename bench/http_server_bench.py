"""The metrics port's server against the stdlib's thread-per-connection one, in one process, on the same answer.

Both serve a 200 kB body (a busy node's gzip-less /metrics is larger, its gzip one smaller) with TCP_NODELAY, one
over exporter/http_server.py (the selector reads the head, a worker answers, the connection goes back to the
selector) and one over ``http.server.ThreadingHTTPServer`` (what the daemon ran before). Measured: GET latency on
one kept-alive connection (Prometheus' way), on a new connection per GET, and /healthz latency and the process's
thread count with 600 idle connections open.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import BenchArgs, Row, median, percentile
from exporter.http_server import BoundedHTTPServer, OneRequestHandler

NAME = "http_server"
BODY = b"x" * 200_000
IDLE = 600


def _answer(handler: BaseHTTPRequestHandler) -> None:
    body = BODY if handler.path == "/metrics" else b"ok\n"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Bounded(OneRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        _answer(self)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Threaded(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        _answer(self)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def bounded() -> Iterator[int]:
    server = BoundedHTTPServer(("127.0.0.1", 0), _Bounded)
    server.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.stop()


@contextmanager
def threaded() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Threaded)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def kept_alive(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            out.append(time.perf_counter() - start)
    finally:
        conn.close()
    return out


def fresh(port: int, n: int, path: str = "/metrics") -> list[float]:
    """Seconds per GET of ``path``, each on a new connection."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", path)
        conn.getresponse().read()
        conn.close()
        out.append(time.perf_counter() - start)
    return out


def under_idle(port: int, n: int) -> tuple[list[float], int]:
    """/healthz latency and this process's threads while IDLE connections sit open."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(IDLE)]
    try:
        time.sleep(0.5)
        threads = threading.active_count()
        return fresh(port, n, "/healthz"), threads
    finally:
        for s in idle:
            s.close()


def run(args: BenchArgs) -> list[Row]:
    n = 50 if args.quick else max(100, args.scrapes)
    rows: list[Row] = []
    results: dict[str, dict[str, float]] = {}
    servers: dict[str, Callable[[], AbstractContextManager[int]]] = {"bounded": bounded, "threaded": threaded}
    for name, make in servers.items():
        with make() as port:
            kept_alive(port, 5)
            keep = kept_alive(port, n)
            new = fresh(port, n)
            idle, threads = under_idle(port, max(20, n // 5))
        results[name] = {
            "keep_p50": median(keep) * 1e3,
            "keep_p99": percentile(keep, 0.99) * 1e3,
            "fresh_p50": median(new) * 1e3,
            "idle_p50": median(idle) * 1e3,
            "threads": float(threads),
        }
    for metric, unit in (
        ("keep_p50", "ms"),
        ("keep_p99", "ms"),
        ("fresh_p50", "ms"),
        ("idle_p50", "ms"),
        ("threads", "threads"),
    ):
        rows += [Row(f"http {metric} ({name})", unit, results[name][metric], note=f"{n} GETs") for name in servers]
        ratio = results["bounded"][metric] / results["threaded"][metric]
        rows.append(Row(f"http {metric} bounded/threaded", "ratio", ratio))
    return rows


if __name__ == "__main__":
    for row in run(BenchArgs()):
        print(f"{row.metric:<40} {row.value:>10.3f} {row.unit:<8} {row.note}")
