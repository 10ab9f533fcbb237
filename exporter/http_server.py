"""An HTTP/1.1 server whose threads and connections are bounded, whatever clients do.

A thread per connection (``ThreadingHTTPServer``) lets anyone who can reach the port hold every thread the unit may
start with idle connections, before any credential is checked. Here no thread waits on a client:

- one selector thread accepts connections, completes their TLS handshakes and reads each request's head (request
  line and headers) without blocking, within ``HEADER_TIMEOUT_SECONDS`` of the connection arriving (or
  ``KEEPALIVE_SECONDS`` between two requests of a kept-alive connection); a connection that has sent nothing whole
  by then is closed;
- a fixed pool of ``WORKERS`` threads answers requests whose head is complete, one request at a time, and hands a
  kept-alive connection back to the selector; writing an answer has its own deadline (``WRITE_TIMEOUT_SECONDS``);
- at most ``MAX_CONNECTIONS`` connections are open: a new one past the limit closes the oldest waiting one (an idle
  client loses its connection, a client that sends its request at once is served), or is refused when every
  open connection is being answered.

So idle or slow connections cost a file descriptor and a few bytes each, never a thread, and the health check and
the scrape keep answering while hundreds of them are open.

``requests`` (exporter/inflight.py) counts what is being read or answered: each wake of the selector with sockets to
read, until it has handled them, and each request from its dispatch until its answer is written. A long render
waits while the count is above zero, so a request's threads do not queue behind it for the GIL.
"""

from __future__ import annotations

import contextlib
import io
import queue
import selectors
import socket
import socketserver
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import structlog

from exporter.inflight import RequestsInFlight

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = structlog.get_logger("http")

WORKERS = 8
MAX_CONNECTIONS = 256
HEADER_TIMEOUT_SECONDS = 10.0
KEEPALIVE_SECONDS = 30.0
WRITE_TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 64 * 1024  # http.server's own limit for one line; a head that large is refused
_READ_CHUNK = 16 * 1024
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket
    address: Any
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)
    handshaking: bool = False

    def head_complete(self) -> bool:
        return any(end in self.buffer for end in _HEAD_ENDS)


class _Stop:
    """Tells a worker to end."""


class OneRequestHandler(BaseHTTPRequestHandler):
    """BaseHTTPRequestHandler answering one request whose head the selector already read (``server.head_of``).

    The server, not the handler, decides what happens to the connection after it: kept alive (back to the
    selector, with any bytes the client sent beyond this request) or closed."""

    server: BoundedHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self.server.head_of(self.request))
        self.wfile = _SendAll(self.request)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        self.wfile.flush()

    def rest(self) -> bytes:
        """What the client sent after this request (a pipelined next request)."""
        return self.rfile.read()


class _SendAll(io.BufferedIOBase):
    """wfile over ``sendall``: a short write never drops the tail of an answer."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        view = memoryview(data)
        self._sock.sendall(view)
        return view.nbytes


class BoundedHTTPServer(socketserver.TCPServer):
    """TCPServer's listener (bind, address family, reuse) with the selector and worker pool above."""

    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: a burst of connections waits in the kernel, not refused

    def __init__(
        self, address: tuple[str, int], handler: type[OneRequestHandler], requests: RequestsInFlight | None = None
    ) -> None:
        """``requests``: where this server counts what it answers (one the rest of the process gives way to)."""
        # made before TCPServer binds: a failed bind calls server_close(), which closes these too
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        super().__init__(address, handler)
        self._handler = handler
        self.socket.setblocking(False)
        self._returned: queue.SimpleQueue[_Connection] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[_Connection | _Stop] = queue.SimpleQueue()
        self._heads: dict[socket.socket, bytes] = {}
        self._waiting: dict[socket.socket, _Connection] = {}  # oldest first: the one to close when over the limit
        self._busy = 0  # connections queued for or being answered by a worker
        self.requests = requests if requests is not None else RequestsInFlight()
        self._lock = threading.Lock()
        self._running = False
        self._threads: list[threading.Thread] = []

    # ----- what subclasses may change ----------------------------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for a new connection (None: plain HTTP)."""
        return None

    # ----- the handler's side ------------------------------------------------------------------------------------

    def head_of(self, sock: socket.socket) -> bytes:
        with self._lock:
            return self._heads.pop(sock, b"")

    # ----- start and stop ----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._threads = [threading.Thread(target=self._select_loop, name="http", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work_loop, name=f"http-worker-{i}", daemon=True) for i in range(WORKERS)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every waiting connection; an answer being written gets up to ``timeout``."""
        self._running = False
        self._wake()
        for _ in range(WORKERS):
            self._work.put(_Stop())
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        while True:  # kept-alive connections handed back after the selector ended
            try:
                conn = self._returned.get_nowait()
            except queue.Empty:
                break
            with contextlib.suppress(OSError):
                conn.sock.close()
        self.server_close()

    def server_close(self) -> None:
        """Close what the constructor opened (the listener, the selector and its wake-up pair), started or not."""
        super().server_close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._waiting) + self._busy

    # ----- the selector thread -----------------------------------------------------------------------------------

    def _select_loop(self) -> None:
        while self._running:
            events = self._selector.select(timeout=self._next_timeout())
            if events:
                self.requests.begin()
            try:
                for key, _ in events:
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        self._readable(key.data)
            finally:
                if events:
                    self.requests.end()
            self._expire(time.monotonic())
        for conn in list(self._waiting.values()):
            self._close(conn)

    def _next_timeout(self) -> float:
        if not self._waiting:
            return 1.0
        oldest = min(c.deadline for c in self._waiting.values())
        return max(0.0, min(1.0, oldest - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: make room, try again on the next event
                log.warning("http accept failed", error=str(exc))
                if not self._evict_oldest():
                    time.sleep(0.05)  # nothing of ours to close: do not spin on a listener that stays readable
                return
            if not self._make_room():
                sock.close()  # every open connection is being answered: refused
                continue
            self._admit(sock, address)

    def _make_room(self) -> bool:
        with self._lock:
            full = len(self._waiting) + self._busy >= MAX_CONNECTIONS
        return not full or self._evict_oldest()

    def _evict_oldest(self) -> bool:
        oldest = next(iter(self._waiting.values()), None)
        if oldest is None:
            return False
        log.debug("http connection closed to make room", client=str(oldest.address))
        self._close(oldest)
        return True

    def _admit(self, sock: socket.socket, address: Any) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # headers and body leave in two writes: no delayed-ACK wait
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(sock, address, time.monotonic() + HEADER_TIMEOUT_SECONDS)
        tls = self.tls_context()
        if tls is not None:
            try:
                conn.sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                sock.close()
                return
            conn.handshaking = True
        self._park(conn)
        if conn.handshaking:
            self._readable(conn)  # the ClientHello may be there already

    def _park(self, conn: _Connection, events: int = selectors.EVENT_READ) -> None:
        with self._lock:
            self._waiting[conn.sock] = conn
        try:
            self._selector.register(conn.sock, events, conn)
        except KeyError:
            self._selector.modify(conn.sock, events, conn)

    def _readable(self, conn: _Connection) -> None:
        if conn.handshaking and not self._handshake(conn):
            return
        try:
            while len(conn.buffer) <= MAX_HEAD_BYTES:
                chunk = conn.sock.recv(_READ_CHUNK)
                if not chunk:  # the client closed
                    self._close(conn)
                    return
                conn.buffer += chunk
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, InterruptedError):
            pass
        except OSError:
            self._close(conn)
            return
        if conn.head_complete():
            self._dispatch(conn)
        elif len(conn.buffer) > MAX_HEAD_BYTES:
            with contextlib.suppress(OSError):
                conn.sock.send(_TOO_LARGE)
            self._close(conn)

    def _handshake(self, conn: _Connection) -> bool:
        """One step of a non-blocking TLS handshake; True once it is done."""
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return False
        except (ssl.SSLError, OSError) as exc:
            log.debug("tls handshake failed", client=str(conn.address), error=str(exc))
            self._close(conn)
            return False
        conn.handshaking = False
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        return True

    def _dispatch(self, conn: _Connection) -> None:
        """A whole head: off the selector, to a worker."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        with self._lock:
            self._waiting.pop(conn.sock, None)
            self._heads[conn.sock] = bytes(conn.buffer)
            self._busy += 1
        conn.buffer.clear()
        self.requests.begin()  # ended by the worker once the answer is written
        self._work.put(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._waiting.values() if c.deadline <= now]:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        with self._lock:
            self._waiting.pop(conn.sock, None)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                conn = self._returned.get_nowait()
            except queue.Empty:
                return
            if not self._running:
                self._close(conn)
            elif conn.head_complete():  # the client sent its next request with the last one
                self._dispatch(conn)
            else:
                self._park(conn)
                self._readable(conn)  # bytes TLS already decrypted wake no selector; read what is there

    # ----- the workers -------------------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            conn = self._work.get()
            if isinstance(conn, _Stop):
                return
            keep = False
            try:
                conn.sock.settimeout(WRITE_TIMEOUT_SECONDS)
                handler = self._handler(conn.sock, conn.address, self)
                keep = not handler.close_connection and self._running
                if keep:
                    conn.buffer += handler.rest()
            except Exception:
                self.handle_error(conn.sock, conn.address)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._heads.pop(conn.sock, None)
                self.requests.end()
            if keep:
                conn.sock.setblocking(False)
                conn.deadline = time.monotonic() + (HEADER_TIMEOUT_SECONDS if conn.buffer else KEEPALIVE_SECONDS)
                self._returned.put(conn)
                self._wake()
            else:
                with contextlib.suppress(OSError):
                    conn.sock.close()
