"""Test helpers: a real NOTIFY_SOCKET, the daemon as a subprocess, a throwaway CA (cryptography)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.paths import REPO


def terminate(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


class NotifySocket:
    """What systemd listens on: an AF_UNIX datagram socket; messages() yields each datagram as a dict."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[dict[str, str]] = []

    def next(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        message = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.received.append(message)
        return message

    def wait_for(self, key: str, timeout: float = 30.0) -> dict[str, str]:
        """Skip messages until one has ``key``; fails after ``timeout`` seconds (a bound, not a measurement)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.next(left)
            if message is not None and key in message:
                return message
        raise AssertionError(f"no {key} message within {timeout}s; got {self.received[-5:]}")

    def drain(self, quiet: float) -> list[dict[str, str]]:
        """Everything that arrives until nothing has come for ``quiet`` seconds."""
        out = []
        while (message := self.next(quiet)) is not None:
            out.append(message)
        return out

    def close(self) -> None:
        self.sock.close()


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    log: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.pump is not None:
            self.pump.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def events(self) -> list[dict[str, Any]]:
        while True:
            try:
                self.log.append(self.lines.get_nowait())
            except queue.Empty:
                break
        out = []
        for line in self.log:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def wait_event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event.get("event") == name:
                    return event
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"daemon never logged {name!r}; output:\n" + "\n".join(self.log[-30:]))

    def metrics_port(self) -> int:
        return int(self.wait_event("metrics listening")["port"])

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        return terminate(self.proc)


def start_daemon(args: Sequence[str], env: dict[str, str], *, python: Sequence[str] | None = None) -> DaemonProcess:
    cmd = [*(python or [sys.executable, "-m", "healthd"]), *args]
    full_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM")}
    full_env.update(env)
    full_env.setdefault("PYTHONPATH", str(REPO))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=str(REPO)
    )
    daemon = DaemonProcess(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            daemon.lines.put(line.rstrip("\n"))

    daemon.pump = threading.Thread(target=pump, daemon=True)
    daemon.pump.start()
    return daemon


@contextlib.contextmanager
def running_daemon(args: Sequence[str], env: dict[str, str], **kw: Any) -> Iterator[DaemonProcess]:
    daemon = start_daemon(args, env, **kw)
    try:
        yield daemon
    finally:
        daemon.close()


# ----- a throwaway PKI -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str = "xpu test CA") -> tuple[Pem, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert, key), cert, key


def issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, cn: str, *, server: bool) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return _pem(builder.sign(ca_key, hashes.SHA256()), key)


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    return Pem(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


@dataclass(frozen=True)
class Pki:
    ca: Pem
    server: Pem
    client: Pem
    rogue_client: Pem  # signed by another CA

    def write(self, directory: Path) -> dict[str, Path]:
        files = {
            "ca.crt": self.ca.cert,
            "server.crt": self.server.cert,
            "server.key": self.server.key,
            "client.crt": self.client.cert,
            "client.key": self.client.key,
            "rogue.crt": self.rogue_client.cert,
            "rogue.key": self.rogue_client.key,
        }
        out = {}
        for name, data in files.items():
            (directory / name).write_bytes(data)
            out[name] = directory / name
        return out


def make_pki() -> Pki:
    ca, ca_cert, ca_key = make_ca()
    _, other_cert, other_key = make_ca("someone else's CA")
    return Pki(
        ca=ca,
        server=issue(ca_cert, ca_key, "localhost", server=True),
        client=issue(ca_cert, ca_key, "prometheus", server=False),
        rogue_client=issue(other_cert, other_key, "intruder", server=False),
    )
