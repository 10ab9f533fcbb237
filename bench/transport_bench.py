"""Transport security benchmark: what TLS and basic auth cost a scrape, and how long the daemon takes to READY.

Run: python3 bench/transport_bench.py [--scrapes 200] [--bcrypt-rounds 12]

- /metrics on the simulated 8x H200 node: plain HTTP, HTTPS (new connection per scrape, as Prometheus does when
  keep-alive is off), HTTPS + basic auth with the success cache, and one uncached bcrypt check at the given cost;
- start to READY=1: the daemon as a subprocess with a real NOTIFY_SOCKET, median of a few starts.
"""

from __future__ import annotations

import argparse
import base64
import logging
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bcrypt
import structlog
from prometheus_client.registry import CollectorRegistry

from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.http import Health, MetricsHTTPServer
from exporter.sampler import Sampler, SamplerSettings
from exporter.webconfig import BasicAuthenticator, parse_web_config
from tests.support.servicehelpers import make_pki

ROOT = Path(__file__).resolve().parent.parent


def scrape_ms(url: str, n: int, *, ctx: ssl.SSLContext | None = None, auth: str | None = None) -> list[float]:
    out = []
    for _ in range(n):
        request = urllib.request.Request(url)
        if auth:
            request.add_header("Authorization", auth)
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10, context=ctx) as reply:
            reply.read()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(name: str, values: list[float]) -> None:
    values = sorted(values)
    p95 = values[int(0.95 * (len(values) - 1))]
    print(f"{name:<44} median {statistics.median(values):7.2f} ms   p95 {p95:7.2f} ms")


def ready_seconds(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(f"{tmp}/notify")
            sock.settimeout(60)
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "healthd",
                    "--simulate",
                    "h200x8",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--grpc-listen",
                    f"unix:{tmp}/h.sock",
                    "--state-dir",
                    f"{tmp}/state",
                ],
                cwd=ROOT,
                env={"NOTIFY_SOCKET": f"{tmp}/notify", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                while b"READY=1" not in sock.recv(4096):
                    pass
                out.append(time.perf_counter() - t0)
            finally:
                proc.terminate()
                proc.wait(30)
                sock.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--bcrypt-rounds", type=int, default=12)
    ap.add_argument("--starts", type=int, default=3)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    sampler = Sampler(SimulatedBackend.from_name("h200x8"), SamplerSettings(interval_seconds=3600))
    sampler.run_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler.latest, default_collectors()))
    server = MetricsHTTPServer(("127.0.0.1", 0), registry, health=lambda: Health(True, "ok"))
    server.start()
    pki = make_pki()
    with tempfile.TemporaryDirectory() as tmp:
        paths = pki.write(Path(tmp))
        ctx = ssl.create_default_context(cafile=str(paths["ca.crt"]))
        url = f"http://127.0.0.1:{server.port}/metrics"
        summary("plain HTTP", scrape_ms(url, args.scrapes))

        tls = {"cert_file": str(paths["server.crt"]), "key_file": str(paths["server.key"])}
        server.set_web_config(parse_web_config({"tls_server_config": tls}, base_dir=Path(tmp)))
        url = f"https://localhost:{server.port}/metrics"
        summary("HTTPS (TLS 1.3, ECDSA P-256, new connection)", scrape_ms(url, args.scrapes, ctx=ctx))

        hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=args.bcrypt_rounds)).decode()
        data = {"tls_server_config": tls, "basic_auth_users": {"prometheus": hashed}}
        server.set_web_config(parse_web_config(data, base_dir=Path(tmp)))
        auth = "Basic " + base64.b64encode(b"prometheus:pw").decode()
        summary(
            f"HTTPS + basic auth (bcrypt cost {args.bcrypt_rounds}, cached)",
            scrape_ms(url, args.scrapes, ctx=ctx, auth=auth),
        )

    checker = BasicAuthenticator({"prometheus": hashed.encode()})
    t0 = time.perf_counter()
    checker.check(auth)
    print(f"{'one uncached bcrypt check (first scrape)':<44} {1000 * (time.perf_counter() - t0):7.1f} ms")
    server.stop()
    sampler.stop()

    starts = ready_seconds(args.starts)
    print(f"{'start to READY=1 (simulated 8x H200)':<44} median {statistics.median(starts):7.2f} s  over {len(starts)}")


if __name__ == "__main__":
    main()
