"""Transport security with real clients: gRPC over mTLS (test CA), the unix socket's mode and group, and /metrics
with TLS and basic auth from an exporter-toolkit web config file."""

from __future__ import annotations

import asyncio
import base64
import grp
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Gauge

from exporter.http import Health, MetricsHTTPServer
from exporter.webconfig import WebConfigError, load_web_config
from healthd.api.v1 import simulation_pb2 as spb
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc
from healthd.daemon.config import ConfigError
from healthd.rpc.server import GrpcServer
from healthd.rpc.transport import TransportSettings, load_grpc_tls
from tests.support.servicehelpers import NotifySocket, Pki, make_pki, running_daemon


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def certs(pki: Pki, tmp_path: Path) -> dict[str, Path]:
    return pki.write(tmp_path)


def tls_settings(certs: dict[str, Path]) -> TransportSettings:
    return TransportSettings(
        grpc_tls_cert_file=certs["server.crt"],
        grpc_tls_key_file=certs["server.key"],
        grpc_tls_client_ca_file=certs["ca.crt"],
    )


# ----- gRPC --------------------------------------------------------------------------------------------------


def health_check(port: int, credentials: grpc.ChannelCredentials) -> int:
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)


def refused_credentials(pki: Pki) -> dict[str, grpc.ChannelCredentials]:
    return {
        "no client certificate": grpc.ssl_channel_credentials(pki.ca.cert),
        "certificate from another CA": grpc.ssl_channel_credentials(
            pki.ca.cert, pki.rogue_client.key, pki.rogue_client.cert
        ),
    }


def test_grpc_tcp_requires_a_client_certificate_from_our_ca(pki: Pki, certs: dict[str, Path], tmp_path: Path) -> None:
    async def body() -> None:
        tls = load_grpc_tls(tls_settings(certs), ["127.0.0.1:0"])
        server = GrpcServer([f"unix:{tmp_path}/h.sock", "127.0.0.1:0"], [], tls=tls)
        await server.start()
        try:
            (port,) = server.tcp_ports
            good = grpc.ssl_channel_credentials(pki.ca.cert, pki.client.key, pki.client.cert)
            assert await asyncio.to_thread(health_check, port, good) == health_pb2.HealthCheckResponse.SERVING
            for name, creds in refused_credentials(pki).items():
                with pytest.raises(grpc.RpcError) as err:
                    await asyncio.to_thread(health_check, port, creds)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
        finally:
            await server.stop(0.5)

    asyncio.run(body())


def test_unix_socket_is_0660_and_owned_by_the_configured_group(tmp_path: Path) -> None:
    gid = next(g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getgid())
    path = tmp_path / "h.sock"

    async def body() -> None:
        server = GrpcServer([f"unix:{path}"], [], socket_mode=0o660, socket_group=gid)
        await server.start()
        try:
            st = path.stat()
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o660
            assert st.st_gid == gid
        finally:
            await server.stop(0.5)

    asyncio.run(body())


def test_tcp_without_tls_is_refused() -> None:
    server = GrpcServer(["127.0.0.1:0"], [])
    with pytest.raises(ValueError, match="need mTLS"):
        asyncio.run(server.start())


def test_incomplete_or_broken_grpc_tls_names_the_option(certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^daemon.grpc_listen: TCP listener 0.0.0.0:9411 needs mTLS.*client_ca"):
        load_grpc_tls(TransportSettings(grpc_tls_cert_file=certs["server.crt"]), ["0.0.0.0:9411"])
    missing = TransportSettings(
        grpc_tls_cert_file=certs["server.crt"],
        grpc_tls_key_file=tmp_path / "nope.key",
        grpc_tls_client_ca_file=certs["ca.crt"],
    )
    with pytest.raises(ConfigError, match=r"^transport.grpc_tls_key_file: cannot read .*nope.key"):
        load_grpc_tls(missing, ["0.0.0.0:9411"])
    mismatched = TransportSettings(
        grpc_tls_cert_file=certs["server.crt"],
        grpc_tls_key_file=certs["client.key"],
        grpc_tls_client_ca_file=certs["ca.crt"],
    )
    with pytest.raises(ConfigError, match=r"^transport.grpc_tls_cert_file/grpc_tls_key_file: not a matching"):
        load_grpc_tls(mismatched, ["0.0.0.0:9411"])
    not_ca = TransportSettings(
        grpc_tls_cert_file=certs["server.crt"],
        grpc_tls_key_file=certs["server.key"],
        grpc_tls_client_ca_file=certs["server.key"],
    )
    with pytest.raises(ConfigError, match=r"^transport.grpc_tls_client_ca_file: not a PEM CA"):
        load_grpc_tls(not_ca, ["0.0.0.0:9411"])
    assert load_grpc_tls(TransportSettings(), []) is None


# ----- /metrics ----------------------------------------------------------------------------------------------

PASSWORD = "s3cret-scrape-password"


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_web_config(path: Path, *, tls: bool, users: dict[str, str], client_auth: str = "NoClientCert") -> Path:
    lines = []
    if tls:
        lines += [
            "tls_server_config:",
            "  cert_file: server.crt",  # relative to the web config file, as in exporter-toolkit
            "  key_file: server.key",
            f"  client_auth_type: {client_auth}",
            "  client_ca_file: ca.crt",
            "  min_version: TLS12",
        ]
    if users:
        lines.append("basic_auth_users:")
        lines += [f"  {user}: {hashed}" for user, hashed in users.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def http_server(certs: dict[str, Path]) -> Iterator[MetricsHTTPServer]:
    registry = CollectorRegistry()
    Gauge("xpu_test_gauge", "test", registry=registry).set(1)
    server = MetricsHTTPServer(("127.0.0.1", 0), registry, health=lambda: Health(True, "ok"))
    server.start()
    yield server
    server.stop()


def get(url: str, *, user: str | None = None, password: str | None = None, ctx: ssl.SSLContext | None = None) -> int:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as reply:
            body = reply.read().decode()
            assert "xpu_test_gauge 1.0" in body or "xpu_gpu_info" in body or reply.url.endswith("/healthz")
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        error = exc
    challenge = error.headers["WWW-Authenticate"]
    error.close()
    if error.code == 401:
        assert challenge == 'Basic realm="xpu-healthd"'
    return error.code


def client_context(pki: Pki, certs: dict[str, Path], *, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    if client_cert:
        ctx.load_cert_chain(certs["client.crt"], certs["client.key"])
    return ctx


def test_metrics_over_tls_with_basic_auth(
    http_server: MetricsHTTPServer, pki: Pki, certs: dict[str, Path], tmp_path: Path
) -> None:
    web = write_web_config(tmp_path / "web.yml", tls=True, users={"prometheus": bcrypt_hash(PASSWORD)})
    http_server.set_web_config(load_web_config(web))
    url = f"https://localhost:{http_server.port}/metrics"
    ctx = client_context(pki, certs, client_cert=False)
    assert http_server.scheme == "https"
    assert get(url, user="prometheus", password=PASSWORD, ctx=ctx) == 200
    assert get(url, user="prometheus", password=PASSWORD, ctx=ctx) == 200  # the cached success
    assert get(url, user="prometheus", password="wrong", ctx=ctx) == 401
    assert get(url, user="nobody", password=PASSWORD, ctx=ctx) == 401
    assert get(url, ctx=ctx) == 401
    assert get(f"https://localhost:{http_server.port}/healthz", ctx=ctx) == 401  # everything is behind auth
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to a TLS port gets nothing
        urllib.request.urlopen(f"http://localhost:{http_server.port}/metrics", timeout=5)


def test_metrics_client_certificate_required(
    http_server: MetricsHTTPServer, pki: Pki, certs: dict[str, Path], tmp_path: Path
) -> None:
    web = write_web_config(tmp_path / "web.yml", tls=True, users={}, client_auth="RequireAndVerifyClientCert")
    http_server.set_web_config(load_web_config(web))
    url = f"https://localhost:{http_server.port}/metrics"
    assert get(url, ctx=client_context(pki, certs, client_cert=True)) == 200
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, ctx=client_context(pki, certs, client_cert=False))


def test_basic_auth_without_tls_and_switching_back(http_server: MetricsHTTPServer, tmp_path: Path) -> None:
    web = write_web_config(tmp_path / "web.yml", tls=False, users={"prometheus": bcrypt_hash(PASSWORD)})
    http_server.set_web_config(load_web_config(web))
    url = f"http://127.0.0.1:{http_server.port}/metrics"
    assert get(url) == 401
    assert get(url, user="prometheus", password=PASSWORD) == 200
    http_server.set_web_config(None)
    assert get(url) == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: {key_file: k}\n", r"^tls_server_config.cert_file: required"),
        ("tls_server_config: {cert_file: c, key_file: k, cipher_suites: [X]}\n", r"^tls_server_config.cipher_suites"),
        (
            "tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAnyClientCert}\n",
            r"^tls_server_config.client_auth_type: RequireAnyClientCert accepts unverified",
        ),
        (
            "tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAndVerifyClientCert}\n",
            r"^tls_server_config.client_ca_file: required",
        ),
        ("tls_server_config: {cert_file: c, key_file: k, min_version: TLS9}\n", r"^tls_server_config.min_version"),
        ("basic_auth_users: {alice: plaintext-password}\n", r"^basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users: [alice]\n", r"^basic_auth_users: expected a mapping"),
        ("http_server_config: {http2: true}\n", r"^http_server_config: not supported"),
        ("tls_config: {}\n", r"^tls_config: unknown option"),
        ("a: [b\n", r"not valid YAML"),
        ("- just a list\n", r"expected a mapping at the top level"),
        ("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n", r"^tls_server_config.cert_file"),
    ],
)
def test_bad_web_configs_name_the_option_and_hide_secrets(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=message) as err:
        load_web_config(path)
    assert "plaintext-password" not in str(err.value)


# ----- the daemon end to end ------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_daemon_serves_tls_metrics_and_mtls_grpc_and_rereads_web_config_on_sighup(
    pki: Pki, certs: dict[str, Path], tmp_path: Path
) -> None:
    users = {"prometheus": bcrypt_hash(PASSWORD)}
    web = write_web_config(tmp_path / "web.yml", tls=True, users=users)
    config = tmp_path / "healthd.toml"
    config.write_text(
        "[daemon]\n"
        f'grpc_listen = ["unix:{tmp_path}/h.sock", "127.0.0.1:0"]\n'
        "[transport]\n"
        f'grpc_tls_cert_file = "{certs["server.crt"]}"\n'
        f'grpc_tls_key_file = "{certs["server.key"]}"\n'
        f'grpc_tls_client_ca_file = "{certs["ca.crt"]}"\n'
        f'metrics_web_config_file = "{web}"\n'
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    args = ["--config", str(config), "--simulate", "h200x1", "--metrics-listen", "127.0.0.1:0"]
    try:
        with running_daemon([*args, "--state-dir", str(tmp_path / "st")], {"NOTIFY_SOCKET": str(notify.path)}) as d:
            d.wait_event("ready")
            notify.wait_for("READY")
            port = d.metrics_port()
            ctx = client_context(pki, certs, client_cert=False)
            url = f"https://localhost:{port}/metrics"
            assert get(url, user="prometheus", password=PASSWORD, ctx=ctx) == 200
            assert get(url, user="prometheus", password="new-password", ctx=ctx) == 401

            write_web_config(web, tls=True, users={"prometheus": bcrypt_hash("new-password")})
            d.signal(signal.SIGHUP)
            notify.wait_for("RELOADING")
            notify.wait_for("READY")
            assert get(url, user="prometheus", password="new-password", ctx=ctx) == 200
            assert get(url, user="prometheus", password=PASSWORD, ctx=ctx) == 401

            (grpc_port,) = d.wait_event("grpc listening")["tcp_ports"]
            good = grpc.ssl_channel_credentials(pki.ca.cert, pki.client.key, pki.client.cert)
            assert health_check(grpc_port, good) == health_pb2.HealthCheckResponse.SERVING
            for name, creds in refused_credentials(pki).items():
                with pytest.raises(grpc.RpcError) as err:
                    health_check(grpc_port, creds)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
            # any client certificate of the CA reaches the TCP listener: it reads, it does not change the node
            with grpc.secure_channel(f"localhost:{grpc_port}", good) as channel:
                sim = spb_grpc.SimulationStub(channel)  # type: ignore[no-untyped-call]
                for call, request in (
                    (sim.InjectFault, spb.InjectFaultRequest(kind="hang", gpu=0, params={"call": "*"})),
                    (sim.ClearFaults, spb.ClearFaultsRequest()),
                ):
                    with pytest.raises(grpc.RpcError) as err:
                        call(request, timeout=10)
                    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            xpuctl = [sys.executable, "-m", "healthd.cli", "--socket", f"localhost:{grpc_port}"]
            tls = ["--tls-ca", str(certs["ca.crt"]), "--tls-cert", str(certs["client.crt"])]
            kinds = subprocess.run([*xpuctl, *tls, "--tls-key", str(certs["client.key"]), "simulate", "kinds"],
                                   capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
            assert kinds.returncode == 0, kinds.stderr
            assert "hang" in kinds.stdout
            no_key = subprocess.run([*xpuctl, *tls, "simulate", "kinds"], capture_output=True, text=True, check=False)
            assert no_key.returncode == 2
            assert "TCP connections use mutual TLS; give --tls-key" in no_key.stderr
            assert d.stop() == 0
        output = "\n".join(d.log)
        assert PASSWORD not in output
        assert "new-password" not in output
        assert "$2b$" not in output  # no bcrypt hash in any log line
        assert "PRIVATE KEY" not in output
    finally:
        notify.close()


def test_a_port_in_use_is_an_oserror_naming_the_address(pki: Pki, certs: dict[str, Path], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        server = GrpcServer([address], [], tls=load_grpc_tls(tls_settings(certs), [address]))
        with pytest.raises(OSError, match=f"grpc listen {address}: cannot bind"):
            asyncio.run(server.start())
