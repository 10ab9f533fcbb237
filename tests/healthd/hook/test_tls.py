"""The replacement hook over TCP: the daemon's outbox calls the real reference hook (`xpuctl hook serve`, a separate
process) with mutual TLS, with the certificates of a throwaway CA. Plaintext TCP is refused on both sides."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from healthd.api.v1 import hook_pb2 as hpb
from healthd.api.v1 import hook_pb2_grpc as hpb_grpc
from healthd.daemon.config import Config, ConfigError, parse_config
from healthd.faults.settings import HookSettings, load_hook_tls
from healthd.findings import Action, Severity
from tests.support.faults_helpers import DaemonThread, xid
from tests.support.paths import REPO
from tests.support.servicehelpers import Pki, make_pki
from tests.support.waiting import wait_until

ROOT = REPO


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def certs(pki: Pki, tmp_path: Path) -> dict[str, Path]:
    return pki.write(tmp_path)


class TlsHook:
    """`xpuctl hook serve` on 127.0.0.1 with a port the kernel picks (read back from its log)."""

    def __init__(self, tmp: Path, certs: dict[str, Path], command: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", "127.0.0.1:0", "--exec", command,
             "--state", str(tmp / "hook.sqlite"), "--tls-cert", str(certs["server.crt"]),
             "--tls-key", str(certs["server.key"]), "--tls-client-ca", str(certs["ca.crt"])],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "reference hook listening" in line:
                event = json.loads(line)
                assert event["tls"] is True
                self.port = int(event["port"])
                return
        raise AssertionError(f"hook did not start (exit {self.proc.wait(10)})")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def hook(tmp_path: Path, certs: dict[str, Path]) -> Iterator[TlsHook]:
    ran = tmp_path / "ran.txt"
    server = TlsHook(tmp_path, certs, f'cat > /dev/null; echo "$XPU_FAULT_ID" >> {ran}')
    yield server
    server.stop()


def settings(port: int, certs: dict[str, Path], client: str = "client", **kw: object) -> HookSettings:
    return HookSettings(
        endpoints=(f"127.0.0.1:{port}",),
        min_action="reboot_node",
        backoff_initial_seconds=0.02,
        backoff_max_seconds=0.1,
        tls_ca_file=certs["ca.crt"],
        tls_cert_file=certs[f"{client}.crt"],
        tls_key_file=certs[f"{client}.key"],
        **kw,  # type: ignore[arg-type]
    )


def test_outbox_delivers_over_mtls_to_the_reference_hook(hook: TlsHook, certs: dict[str, Path], tmp_path: Path) -> None:
    # the hook's certificate names localhost and 127.0.0.1; tls_server_name checks it for "localhost" here
    hook_settings = settings(hook.port, certs, tls_server_name="localhost")
    with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook_settings) as d:
        d.engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        target = hook_settings.endpoints[0]
        wait_until(lambda: d.health.dispatcher.delivered[target] == 1, "the fault to reach the TLS hook")
        assert d.engine.journal.outbox_depth() == {}
    assert len((tmp_path / "ran.txt").read_text().split()) == 1


def test_hook_refuses_a_client_certificate_from_another_ca(
    hook: TlsHook, certs: dict[str, Path], tmp_path: Path
) -> None:
    hook_settings = settings(hook.port, certs, client="rogue")
    with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook_settings) as d:
        d.engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        target = hook_settings.endpoints[0]
        wait_until(lambda: d.health.dispatcher.failures[target] >= 2, "deliveries to fail the handshake")
        assert d.engine.journal.outbox_depth() == {target: 1}  # kept for when the certificate is fixed
        head = d.engine.journal.outbox_head(target)
        assert head is not None and head.last_error.startswith("UNAVAILABLE")
    assert not (tmp_path / "ran.txt").exists()


def test_a_rotated_client_certificate_is_picked_up_without_a_restart(
    hook: TlsHook, certs: dict[str, Path], pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "node.crt", tmp_path / "node.key"
    cert.write_bytes(pki.rogue_client.cert)  # an expired/wrong certificate, say
    key.write_bytes(pki.rogue_client.key)
    hook_settings = replace(settings(hook.port, certs), tls_cert_file=cert, tls_key_file=key)
    with DaemonThread(tmp_path / "state", tmp_path / "d.sock", hook=hook_settings) as d:
        d.engine.accept_event(xid(79, severity=Severity.FATAL, action=Action.REBOOT_NODE))
        target = hook_settings.endpoints[0]
        wait_until(lambda: d.health.dispatcher.failures[target] >= 2, "deliveries to fail with the old certificate")
        key.write_bytes(pki.client.key)  # the operator (or cert-manager) replaces the files in place
        cert.write_bytes(pki.client.cert)
        wait_until(lambda: d.health.dispatcher.delivered[target] == 1, "delivery with the new certificate")
    assert len((tmp_path / "ran.txt").read_text().split()) == 1


def test_hook_refuses_plaintext_and_a_wrong_server_name(hook: TlsHook, certs: dict[str, Path], pki: Pki) -> None:
    report = hpb.FaultReport(idempotency_key="flt-plain", fault_id="flt-plain")
    with grpc.insecure_channel(f"127.0.0.1:{hook.port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            hpb_grpc.ReplacementHookStub(channel).ReportFault(report, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    credentials = grpc.ssl_channel_credentials(pki.ca.cert, pki.client.key, pki.client.cert)
    options = [("grpc.ssl_target_name_override", "somewhere-else.example")]
    with grpc.secure_channel(f"127.0.0.1:{hook.port}", credentials, options=options) as channel:
        with pytest.raises(grpc.RpcError) as err:
            hpb_grpc.ReplacementHookStub(channel).ReportFault(report, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tcp_endpoint_without_tls_is_a_config_error_naming_the_option(certs: dict[str, Path], tmp_path: Path) -> None:
    config = parse_config({"hook": {"endpoints": ["unix:/run/hook.sock", "10.0.0.5:7000"]}})
    with pytest.raises(
        ConfigError, match=r"^hook.endpoints: TCP endpoint 10.0.0.5:7000 .* hook.tls_ca_file is not set"
    ):
        config.check_transport()
    assert load_hook_tls(HookSettings(endpoints=("unix:/run/hook.sock",))) is None  # unix stays plaintext
    tls = settings(7000, certs)
    assert load_hook_tls(tls) is not None
    broken = tmp_path / "broken.crt"
    broken.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"^hook.tls_cert_file/tls_key_file: not a matching PEM"):
        load_hook_tls(replace(tls, tls_cert_file=broken))
    with pytest.raises(ConfigError, match=r"^hook.tls_ca_file: cannot read"):
        load_hook_tls(replace(tls, tls_ca_file=tmp_path / "missing.crt"))
    parsed = parse_config(
        {"hook": {"endpoints": ["h:1"], "tls_ca_file": str(certs["ca.crt"]), "tls_server_name": "hook.example"}}
    )
    assert isinstance(parsed, Config)
    assert parsed.hook.tls_ca_file == certs["ca.crt"]
    assert parsed.hook.tls_server_name == "hook.example"


def test_check_config_and_hook_serve_refuse_plaintext_tcp(tmp_path: Path) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text('[hook]\nendpoints = ["127.0.0.1:7000"]\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "healthd", "--config", str(config), "--check-config"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "hook.endpoints: TCP endpoint 127.0.0.1:7000 is called with mTLS" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", "127.0.0.1:0", "--exec", "true",
         "--state", str(tmp_path / "h.sqlite")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "xpuctl: --listen 127.0.0.1:0: a TCP hook uses mutual TLS; give --tls-cert, --tls-key, --tls-client-ca"
    ]


def test_alert_webhook_forwards_to_a_tcp_hook_over_mtls_only(
    hook: TlsHook, certs: dict[str, Path], tmp_path: Path
) -> None:
    from healthd.hook.alertmanager import ForwardError, GrpcHookForwarder

    target = f"127.0.0.1:{hook.port}"
    tls = load_hook_tls(settings(hook.port, certs))
    GrpcHookForwarder(target, tls=tls).report({"idempotency_key": "flt-aw", "fault_id": "flt-aw"})
    assert (tmp_path / "ran.txt").read_text().split() == ["flt-aw"]
    rogue = load_hook_tls(settings(hook.port, certs, client="rogue"))
    with pytest.raises(ForwardError, match="UNAVAILABLE"):
        GrpcHookForwarder(target, tls=rogue).report({"idempotency_key": "flt-rogue"})
    with pytest.raises(ValueError, match="a TCP hook needs mutual TLS"):
        GrpcHookForwarder(target)
    out = subprocess.run(
        [sys.executable, "-m", "healthd.cli", "alert-webhook", "serve", "--listen", "127.0.0.1:0", "--hook", target,
         "--hook-tls-ca", str(certs["ca.crt"])],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"xpuctl: --hook {target}: a TCP hook is called with mutual TLS; give --hook-tls-cert, --hook-tls-key"
    ]
