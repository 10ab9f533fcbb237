"""The metrics port under idle, slow and many connections: threads stay bounded and /healthz keeps answering.

The daemon case drives a real xpu-healthd on the simulated node with 600 idle connections, which with a thread per
connection held every task the unit allows (TasksMax=512). The others run the HTTP server alone, with its limits
made small so that each one is reached quickly.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge

from exporter import http_server
from exporter.http import Health, MetricsHTTPServer
from exporter.webconfig import load_web_config
from tests.support.daemon_process import DaemonProcess
from tests.support.servicehelpers import make_pki

IDLE_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # a head that never ends


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def healthz(port: int, timeout: float = 20.0, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", "/healthz")
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def open_idle(port: int, count: int, *, send: bytes = b"") -> list[socket.socket]:
    out = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if send:
            s.sendall(send)
        out.append(s)
    return out


def closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.e2e
def test_600_idle_connections_hold_no_thread_and_healthz_answers(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        assert d.proc is not None
        assert d.get("/healthz")[0] == 200
        before = threads_of(d.proc.pid)
        idle = open_idle(d.port, 300) + open_idle(d.port, 300, send=IDLE_REQUEST)
        try:
            time.sleep(1.0)  # let the daemon accept them all
            during = threads_of(d.proc.pid)
            status, body = healthz(d.port)
            assert status == 200, body
            assert d.get("/metrics", timeout=20)[0] == 200
            assert during <= before + 2, (before, during)  # no thread per connection
        finally:
            for s in idle:
                s.close()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetricsHTTPServer]:
    monkeypatch.setattr(http_server, "HEADER_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(http_server, "KEEPALIVE_SECONDS", 1.0)
    monkeypatch.setattr(http_server, "MAX_CONNECTIONS", 20)
    registry = CollectorRegistry()
    Gauge("xpu_test_gauge", "test", registry=registry).set(1)
    srv = MetricsHTTPServer(("127.0.0.1", 0), registry, health=lambda: Health(True, "ok"))
    srv.start()
    yield srv
    srv.stop()


def test_connections_past_the_limit_close_the_oldest_idle_ones(server: MetricsHTTPServer) -> None:
    idle = open_idle(server.port, 60)
    try:
        assert closed_by_peer(idle[0], within=5)  # the oldest went to make room
        assert healthz(server.port) == (200, b"ok\n")
        assert server.open_connections <= 20
    finally:
        for s in idle:
            s.close()


def test_an_idle_or_slow_connection_is_closed_at_the_header_deadline(server: MetricsHTTPServer) -> None:
    [idle] = open_idle(server.port, 1)
    [slow] = open_idle(server.port, 1, send=b"GET /healthz HTTP/1.1\r\n")
    try:
        for _ in range(6):  # a byte every 0.3 s: each read would succeed, the head never ends in time
            time.sleep(0.3)
            try:
                slow.sendall(b"X")
            except OSError:
                break
        assert closed_by_peer(slow, within=5)
        assert closed_by_peer(idle, within=5)
    finally:
        idle.close()
        slow.close()


def test_keep_alive_and_pipelined_requests_are_each_answered(server: MetricsHTTPServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/metrics")
            reply = conn.getresponse()
            assert reply.status == 200 and b"xpu_test_gauge 1.0" in reply.read()
    finally:
        conn.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.1 ") == 2
    assert answer.index(b"200 OK") < answer.index(b"404 Not Found")


def test_a_head_over_the_limit_is_refused(server: MetricsHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * (http_server.MAX_HEAD_BYTES + 10))
        assert s.recv(4096).startswith(b"HTTP/1.1 431")


def test_tls_clients_that_idle_after_the_handshake_hold_no_thread(server: MetricsHTTPServer, tmp_path: Path) -> None:
    """With TLS a client that completed the handshake and then idled used to hold a thread; so did one that never
    finished its handshake. Both wait on the selector now, and a new HTTPS client is answered."""
    certs = make_pki().write(tmp_path)
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS12\n"
    )
    server.set_web_config(load_web_config(tmp_path / "web.yml"))
    context = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    before = threads_of_self()
    stalled = open_idle(server.port, 5, send=b"\x16\x03\x01")  # the start of a ClientHello, and no more
    idle = [context.wrap_socket(s, server_hostname="localhost") for s in open_idle(server.port, 10)]
    try:
        assert threads_of_self() <= before
        assert healthz(server.port, context=context) == (200, b"ok\n")
    finally:
        for s in [*stalled, *idle]:
            s.close()


def threads_of_self() -> int:
    import threading

    return threading.active_count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/healthz", "/metrics", "/", "/nope"]),
    cuts=st.lists(st.integers(min_value=1, max_value=80), max_size=6),
    junk=st.binary(max_size=40),
)
def test_a_head_split_anywhere_gets_the_answer_it_gets_whole(
    server: MetricsHTTPServer, path: str, cuts: list[int], junk: bytes
) -> None:
    """The selector reassembles a head sent in pieces; what follows it (the client's next bytes) never changes the
    answer to the first request, and the server keeps answering."""
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Junk: {junk.hex()}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = 0
        for cut in cuts:
            s.sendall(head[start : start + cut])
            start += cut
            time.sleep(0.002)
        s.sendall(head[start:])
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    expected = b"404" if path == "/nope" else b"200"
    assert answer.startswith(b"HTTP/1.1 " + expected), answer[:100]
    assert answer.count(b"HTTP/1.1 ") == 1
