"""Alertmanager webhook -> standby-replacement hook.

Alertmanager's webhook receiver POSTs JSON (payload version 4) with a group of alerts. ``alerts_to_faults`` turns
each firing alert that names an action into one fault report, a plain dict with exactly the fields of the hook's
``FaultReport`` message (ReplacementHook.ReportFault), so a gRPC forwarder builds the request with
``FaultReport(**fault)``; a ``FaultForwarder`` delivers it. The HTTP status tells Alertmanager what to do: 200
delivered (or nothing to deliver), 400 a payload it must not resend, 503 the hook failed and Alertmanager retries.

An alert computed from the daemon's fault metrics carries the daemon's ``fault_id`` and ``node`` labels (the
shipped replace_node rules keep them): the report then uses that fault id as its idempotency key and that node
name, exactly as the daemon's own [hook] push does, so a hook that receives both channels sees one fault. For
other alerts the key is the alert fingerprint + start time, the same for every re-send of one firing (Alertmanager
re-sends on every group change and repeat interval), and the node is the ``node`` label or the instance's host.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog

from healthd.rpc.transport import HookClientTls, hook_credentials, is_tcp

log = structlog.get_logger("alert_webhook")

ACTIONS = ("none", "restart_app", "reset_gpu", "reboot_node", "replace_node")
SEVERITIES = ("info", "warning", "critical", "fatal")
MAX_BODY_BYTES = 1 << 20
WEBHOOK_PATH = "/alertmanager"


class PayloadError(ValueError):
    """The request is not an Alertmanager webhook payload we can read; resending it will not help."""


class ForwardError(Exception):
    """The hook could not take the fault now; Alertmanager should retry."""


class FaultForwarder(Protocol):
    def report(self, fault: Mapping[str, Any]) -> None:
        """Deliver one fault; raise ForwardError when the hook cannot take it now."""


@dataclass(frozen=True, slots=True)
class Conversion:
    faults: tuple[dict[str, Any], ...]
    skipped: tuple[str, ...]  # one line per alert not forwarded, with why


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise PayloadError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _timestamp(value: object, where: str) -> float:
    text = _text(value, where)
    try:
        # Alertmanager writes RFC 3339 with nanoseconds; Python takes at most microseconds
        head, dot, tail = text.partition(".")
        if dot:
            digits = "".join(c for c in tail if c.isdigit())
            zone = tail[len(digits) :]
            text = f"{head}.{digits[:6]}{zone}"
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise PayloadError(f"{where}: not an RFC 3339 time: {value!r}") from None


def _node(labels: Mapping[str, str]) -> str:
    """The node an alert is about: a ``node`` label when relabelling set one, else the instance's host."""
    if labels.get("node"):
        return labels["node"]
    instance = labels.get("instance", "")
    if instance.startswith("["):  # [v6]:port
        return instance[1:].partition("]")[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() else instance


def _string_map(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected an object")
    return {str(k): _text(v, f"{where}.{k}") for k, v in value.items()}


def alerts_to_faults(payload: object) -> Conversion:
    """Alertmanager webhook JSON (version 4) -> fault reports for the hook, one per firing alert with an action."""
    if not isinstance(payload, dict):
        raise PayloadError("payload: expected a JSON object")
    version = payload.get("version")
    if version != "4":
        raise PayloadError(f'version: expected Alertmanager webhook payload version "4", got {version!r}')
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    receiver = str(payload.get("receiver", ""))
    faults: list[dict[str, Any]] = []
    skipped: list[str] = []
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            raise PayloadError(f"{where}: expected an object")
        labels = _string_map(alert.get("labels", {}), f"{where}.labels")
        annotations = _string_map(alert.get("annotations", {}), f"{where}.annotations")
        name = labels.get("alertname", "")
        status = _text(alert.get("status"), f"{where}.status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f"{where}.status: expected firing or resolved, got {status!r}")
        if status == "resolved":
            skipped.append(f"{name}: resolved")
            continue
        action = labels.get("action", "")
        if action not in ACTIONS:
            skipped.append(f"{name}: action {action!r} is not one of {', '.join(ACTIONS)}")
            continue
        if action == "none":
            skipped.append(f"{name}: action none asks for a person, not the hook")
            continue
        severity = labels.get("severity", "")
        if severity not in SEVERITIES:
            severity = "warning"
        node = _node(labels)
        if not node:
            skipped.append(f"{name}: no node or instance label")
            continue
        fingerprint = _text(alert.get("fingerprint", ""), f"{where}.fingerprint")
        starts_at = _text(alert.get("startsAt"), f"{where}.startsAt")
        started = _timestamp(starts_at, f"{where}.startsAt")
        gpu_index = labels.get("gpu", "")
        fault_id = labels.get("fault_id") or f"alertmanager:{fingerprint or name}:{starts_at}"
        evidence = {f"label.{k}": v for k, v in sorted(labels.items())}
        evidence.update(alertname=name, receiver=receiver, runbook=annotations.get("runbook", ""))
        faults.append(
            {
                "idempotency_key": fault_id,
                "node_name": node,
                "fault_id": fault_id,
                "seq": 0,  # Alertmanager has no sequence; the hook dedups on idempotency_key
                "check": labels.get("check", "alertmanager"),
                "code": labels.get("code") or name,
                "severity": severity,
                "action": action,
                "message": annotations.get("summary") or annotations.get("description") or name,
                "gpu_index": int(gpu_index) if gpu_index.isdigit() else -1,
                "gpu_uuid": labels.get("uuid", ""),
                "pci_bus_id": labels.get("pci_bus_id", ""),
                "evidence": evidence,
                "first_seen": started,
                "last_seen": started,
                "count": 1,
                "boot_id": "",
                "fault_json": json.dumps(alert, sort_keys=True),
            }
        )
    return Conversion(tuple(faults), tuple(skipped))


class JsonLinesForwarder:
    """Appends each fault as one JSON line to a file (a spool another process reads, or a record for tests)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def report(self, fault: Mapping[str, Any]) -> None:
        line = json.dumps(dict(fault), sort_keys=True) + "\n"
        try:
            with self._lock, self._path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
        except OSError as exc:
            raise ForwardError(f"cannot write {self._path}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Outcome:
    status: HTTPStatus
    message: str


def handle_payload(body: bytes, forwarder: FaultForwarder) -> Outcome:
    """One webhook request: parse, convert, forward. Never raises; the status says what happened."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return Outcome(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}")
    try:
        conversion = alerts_to_faults(payload)
    except PayloadError as exc:
        return Outcome(HTTPStatus.BAD_REQUEST, str(exc))
    for reason in conversion.skipped:
        log.debug("alert not forwarded", reason=reason)
    failed: list[str] = []
    for fault in conversion.faults:
        try:
            forwarder.report(fault)
        except ForwardError as exc:
            failed.append(f"{fault['fault_id']}: {exc}")
        else:
            log.info("fault forwarded", fault_id=fault["fault_id"], node=fault["node_name"], action=fault["action"])
    if failed:
        log.warning("hook delivery failed", failures=failed)
        return Outcome(HTTPStatus.SERVICE_UNAVAILABLE, "hook unavailable: " + "; ".join(failed))
    return Outcome(HTTPStatus.OK, f"forwarded {len(conversion.faults)}, skipped {len(conversion.skipped)}")


class _Handler(BaseHTTPRequestHandler):
    server: AlertWebhookServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.path.split("?")[0] != WEBHOOK_PATH:
            self._reply(Outcome(HTTPStatus.NOT_FOUND, f"POST Alertmanager webhooks to {WEBHOOK_PATH}"))
            return
        length_text = self.headers.get("Content-Length", "")
        if not length_text.isdigit():
            self._reply(Outcome(HTTPStatus.LENGTH_REQUIRED, "Content-Length required"))
            return
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            if length <= 8 * MAX_BODY_BYTES:  # read it away so the client sees the answer, not a reset
                remaining = length
                while remaining > 0 and (chunk := self.rfile.read(min(65536, remaining))):
                    remaining -= len(chunk)
            self._reply(Outcome(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"))
            self.close_connection = True
            return
        self._reply(handle_payload(self.rfile.read(length), self.server.forwarder))

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(Outcome(HTTPStatus.OK, "ok"))
        else:
            self._reply(Outcome(HTTPStatus.NOT_FOUND, "not found"))

    def _reply(self, outcome: Outcome) -> None:
        body = (outcome.message + "\n").encode()
        self.send_response(outcome.status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http request", line=format % args)


class AlertWebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], forwarder: FaultForwarder) -> None:
        super().__init__(address, _Handler)
        self.forwarder = forwarder

    @property
    def port(self) -> int:
        return int(self.server_address[1])


ForwarderFactory = Callable[[str], FaultForwarder]


class GrpcHookForwarder:
    """Calls ``ReplacementHook.ReportFault`` on the hook; any gRPC failure is a ForwardError (the receiver answers
    503 and Alertmanager retries). The hook dedups on the idempotency key, so a retry never runs twice."""

    def __init__(self, address: str, timeout_seconds: float = 10.0, *, tls: HookClientTls | None = None) -> None:
        from healthd.api.v1 import hook_pb2_grpc

        self._address = address
        self._timeout = timeout_seconds
        if is_tcp(address):  # a hook over TCP is called with mutual TLS only, as the daemon calls it
            if tls is None:
                raise ValueError(f"--hook {address}: a TCP hook needs mutual TLS (--hook-tls-ca, -cert, -key)")
            self._channel = grpc.secure_channel(address, *hook_credentials(tls))
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = hook_pb2_grpc.ReplacementHookStub(self._channel)

    def report(self, fault: Mapping[str, Any]) -> None:
        from healthd.api.v1 import hook_pb2

        try:
            self._stub.ReportFault(hook_pb2.FaultReport(**fault), timeout=self._timeout)
        except grpc.RpcError as exc:
            err: Any = exc
            raise ForwardError(f"hook {self._address}: {err.code().name}: {err.details()}") from exc


def make_forwarder(hook: str | None, spool: Path | None, grpc_factory: ForwarderFactory | None) -> FaultForwarder:
    """The forwarder the command line asks for. ``grpc_factory`` builds the ReplacementHook client for ``hook``."""
    if (hook is None) == (spool is None):
        raise ValueError("give exactly one of --hook unix:PATH|HOST:PORT and --spool FILE")
    if spool is not None:
        return JsonLinesForwarder(spool)
    assert hook is not None
    if grpc_factory is None:
        raise ValueError("--hook: this build has no ReplacementHook client; use --spool FILE")
    return grpc_factory(hook)


def serve(address: tuple[str, int], forwarder: FaultForwarder, stop: threading.Event | None = None) -> None:
    server = AlertWebhookServer(address, forwarder)
    log.info("alert webhook listening", host=address[0], port=server.port, path=WEBHOOK_PATH)
    thread = threading.Thread(target=server.serve_forever, name="alert-webhook", daemon=True)
    thread.start()
    try:
        (stop or threading.Event()).wait()
    finally:
        server.shutdown()
        server.server_close()
