"""The shipped Alertmanager example's inhibit rules, on the real Alertmanager (Debian's prometheus-alertmanager): one
card's replace_node alert silences that card's lesser alerts only. A reset or a hang on another card of the same node
still notifies, so a failed or postponed swap never leaves other cards' faults unheard.

Alerts are posted to the live instance's API (as Prometheus does), the receivers' webhooks point at a recorder in this
test, and the grouping waits are shortened to 1 s (tests/e2e/stack.py fast_routing). amtool shows where each alert
is routed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.stack import AM_EXAMPLE, Process, fast_routing, http_json, http_ok, wait_for
from tests.support.ports import free_port

pytestmark = [pytest.mark.e2e]

NODE = "gpu-node-7:9410"
# the card being replaced, its own lesser alert, and other cards' faults
SWAP = {"alertname": "XpuFatalXid", "code": "xid_79", "action": "replace_node", "severity": "fatal", "gpu": "2"}
SAME_CARD = {"alertname": "XpuGpuVolatileUncorrectableEcc", "action": "reset_gpu", "severity": "critical", "gpu": "2"}
OTHER_RESET = {"alertname": "XpuGpuResetRequired", "action": "reset_gpu", "severity": "critical", "gpu": "5"}
OTHER_HANG = {"alertname": "XpuGpuDriverCallHung", "action": "reboot_node", "severity": "critical", "gpu": "6"}


class Recorder(ThreadingHTTPServer):
    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.notifications: list[tuple[str, dict[str, Any]]] = []  # (path, body)


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.notifications.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _config(tmp: Path, recorder_port: int) -> Path:
    doc = yaml.safe_load(fast_routing(AM_EXAMPLE.read_text(), f"http://127.0.0.1:{recorder_port}/standby"))
    for receiver in doc["receivers"]:  # the example's "ops" has no integration: give it one to observe
        if receiver["name"] == "ops":
            receiver["webhook_configs"] = [{"url": f"http://127.0.0.1:{recorder_port}/ops", "send_resolved": False}]
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Recorder, Path]]:
    if shutil.which("prometheus-alertmanager") is None or shutil.which("amtool") is None:
        pytest.skip("prometheus-alertmanager not installed (./dev test installs it)")
    tmp = tmp_path_factory.mktemp("inhibition")
    recorder = Recorder(free_port())
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    config = _config(tmp, recorder.server_address[1])
    port = free_port()
    args = ["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={tmp / 'data'}"]
    args += [f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
    process = Process("alertmanager", args, tmp / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("alertmanager ready", lambda: process.check_alive() or http_ok(f"{url}/-/ready"))
        yield url, recorder, config
    finally:
        process.stop()
        recorder.shutdown()
        recorder.server_close()


def _post(url: str, *alerts: dict[str, str]) -> None:
    now = datetime.now(UTC)
    body = [
        {
            "labels": {**labels, "instance": NODE, "job": "xpu-healthd"},
            "annotations": {"summary": f"{labels['alertname']} on GPU {labels['gpu']}"},
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        for labels in alerts
    ]
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def _states(url: str) -> dict[str, dict[str, Any]]:
    """alertname -> the alert as /api/v2/alerts/groups shows it (state, inhibitedBy, receivers of its group)."""
    out: dict[str, dict[str, Any]] = {}
    for group in http_json(f"{url}/api/v2/alerts/groups"):
        for alert in group["alerts"]:
            out[alert["labels"]["alertname"]] = {**alert, "group_receiver": group["receiver"]["name"]}
    return out


def _notified(recorder: Recorder, path: str) -> set[tuple[str, str]]:
    return {
        (alert["labels"]["alertname"], alert["labels"]["gpu"])
        for where, body in recorder.notifications
        if where == path
        for alert in body["alerts"]
    }


def test_routes_of_the_four_alerts(alertmanager: tuple[str, Recorder, Path]) -> None:
    _, _, config = alertmanager
    for labels, receivers in ((SWAP, "standby-replacement,ops"), (OTHER_RESET, "ops"), (SAME_CARD, "ops")):
        pairs = [f"{k}={v}" for k, v in {**labels, "instance": NODE}.items()]
        done = subprocess.run(
            ["amtool", "config", "routes", "test", f"--config.file={config}", *pairs],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.stdout.strip() == receivers, (labels, done.stdout, done.stderr)


def test_a_replace_node_on_one_card_inhibits_only_that_card(alertmanager: tuple[str, Recorder, Path]) -> None:
    url, recorder, _ = alertmanager
    _post(url, SWAP)
    wait_for("the replace_node alert delivered to the standby hook", lambda: _notified(recorder, "/standby"))
    _post(url, SAME_CARD, OTHER_RESET, OTHER_HANG)

    def all_four() -> dict[str, dict[str, Any]] | None:
        states = _states(url)
        return states if len(states) == 4 else None

    states = wait_for("all four alerts in Alertmanager", all_four)
    swap_fingerprint = states["XpuFatalXid"]["fingerprint"]
    assert states["XpuGpuVolatileUncorrectableEcc"]["status"]["state"] == "suppressed"
    assert states["XpuGpuVolatileUncorrectableEcc"]["status"]["inhibitedBy"] == [swap_fingerprint]
    for other in ("XpuGpuResetRequired", "XpuGpuDriverCallHung"):
        assert states[other]["status"]["state"] == "active", states[other]
        assert states[other]["status"]["inhibitedBy"] == []

    expected = {("XpuGpuResetRequired", "5"), ("XpuGpuDriverCallHung", "6"), ("XpuFatalXid", "2")}
    wait_for("the other cards' alerts notified to ops", lambda: expected <= _notified(recorder, "/ops"))
    time.sleep(2)  # two more group_wait/group_interval periods in which a notification of the inhibited one could come
    assert ("XpuGpuVolatileUncorrectableEcc", "2") not in _notified(recorder, "/ops")
    assert _notified(recorder, "/standby") == {("XpuFatalXid", "2")}
