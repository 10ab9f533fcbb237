"""The observability path as real processes: xpu-healthd (simulated GPUs), Prometheus with the shipped rules,
Alertmanager with the shipped example routing, `xpuctl alert-webhook serve` forwarding replace_node alerts over
gRPC to a recording ReplacementHook (or, with ``hook_command``, the reference hook `xpuctl hook serve` running that
command), which also receives the daemon's own fault outbox.

Test-only changes to the shipped files, made on copies in tmp: every rule's ``for:`` becomes 2s and Alertmanager's
group_wait/group_interval become 1s, so an alert travels the whole path in seconds instead of minutes; the webhook
URL points at this test's receiver. Nothing else in the rules or the routing is changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.waiting import wait_until

ROOT = REPO
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yml"))
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
TEST_FOR = "2s"
T = TypeVar("T")

BINARIES = ("prometheus", "prometheus-alertmanager")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def wait_for(what: str, probe: Callable[[], T], timeout: float = 30.0, step: float = 0.25) -> T:
    """wait_until with this stack's pace: Prometheus and Alertmanager are polled four times a second."""
    return wait_until(probe, what, timeout, step=step)


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def shortened_rules(text: str) -> str:
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    return str(yaml.safe_dump(doc, sort_keys=False))


def fast_routing(text: str, webhook_url: str) -> str:
    doc = yaml.safe_load(text)
    routes = [doc["route"]]
    while routes:
        route = routes.pop()
        for key in ("group_wait", "group_interval"):
            if key in route or route is doc["route"]:
                route[key] = "1s"
        routes.extend(route.get("routes", []))
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook_url
    return str(yaml.safe_dump(doc, sort_keys=False))


class Process:
    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self.log = log
        self._file = log.open("ab")
        self.proc = subprocess.Popen(args, stdout=self._file, stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._file.close()


class Stack:
    def __init__(self, tmp: Path, daemon_config: str = "", *, hook_command: str | None = None) -> None:
        self.tmp = tmp
        self.hook_command = hook_command
        self.hook_state = tmp / "hook-state.sqlite"  # the reference hook's executions
        (tmp / "daemon").mkdir(parents=True, exist_ok=True)
        self.hook_socket = tmp / "hook.sock"
        hook_config = f'[hook]\nendpoints = ["unix:{self.hook_socket}"]\nmin_action = "replace_node"\n'
        self.daemon = DaemonProcess(
            tmp / "daemon", interval=0.3, deadline=0.3, extra_config=hook_config + daemon_config
        )
        self.prom_port = free_port()
        self.am_port = free_port()
        self.hook_port = free_port()
        self.spool = tmp / "hook-faults.jsonl"
        self.processes: list[Process] = []

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.daemon.port}"

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def alertmanager(self) -> str:
        return f"http://127.0.0.1:{self.am_port}"

    def start(self) -> Stack:
        self._start_hook()
        self.daemon.start()
        return self.start_observers()

    def _start_hook(self) -> None:
        if self.hook_command is not None:
            args = [sys.executable, "-m", "healthd.cli", "hook", "serve", "--listen", f"unix:{self.hook_socket}"]
            args += ["--exec", self.hook_command, "--state", str(self.hook_state)]
        else:
            args = [sys.executable, "-m", "tests.e2e.recording_hook", "--listen", f"unix:{self.hook_socket}"]
            args += ["--out", str(self.spool)]
        self.processes.append(Process("recording-hook", args, self.tmp / "hook.log"))
        wait_for("recording hook", lambda: self.hook_socket.exists())

    def start_observers(self) -> Stack:
        """Prometheus, Alertmanager and the webhook receiver, once the daemon runs."""
        self._start_webhook()
        self._start_alertmanager()
        self._start_prometheus()
        wait_for("webhook receiver", lambda: http_ok(f"http://127.0.0.1:{self.hook_port}/healthz"))
        wait_for("alertmanager ready", lambda: self._alive() and http_ok(f"{self.alertmanager}/-/ready"))
        wait_for("prometheus ready", lambda: self._alive() and http_ok(f"{self.prometheus}/-/ready"))
        wait_for("first scrape", lambda: self.query(f'up{{job="xpu-healthd", instance="{self.instance}"}} == 1'))
        return self

    def _alive(self) -> bool:
        for p in self.processes:
            p.check_alive()
        return True

    def _start_webhook(self) -> None:
        args = [sys.executable, "-m", "healthd.cli", "alert-webhook", "serve"]
        args += ["--listen", f"127.0.0.1:{self.hook_port}", "--hook", f"unix:{self.hook_socket}"]
        self.processes.append(Process("alert-webhook", args, self.tmp / "webhook.log"))

    def _start_alertmanager(self) -> None:
        config = self.tmp / "alertmanager.yml"
        config.write_text(fast_routing(AM_EXAMPLE.read_text(), f"http://127.0.0.1:{self.hook_port}/alertmanager"))
        args = [
            "prometheus-alertmanager",
            f"--config.file={config}",
            f"--storage.path={self.tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{self.am_port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        self.processes.append(Process("alertmanager", args, self.tmp / "alertmanager.log"))

    def _start_prometheus(self) -> None:
        rule_paths = []
        for path in RULE_FILES:
            copy = self.tmp / path.name
            copy.write_text(shortened_rules(path.read_text()))
            rule_paths.append(str(copy))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": rule_paths,
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
            "scrape_configs": [{"job_name": "xpu-healthd", "static_configs": [{"targets": [self.instance]}]}],
        }
        path = self.tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        args = [
            "prometheus",
            f"--config.file={path}",
            f"--storage.tsdb.path={self.tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}",
            "--log.level=warn",
        ]
        self.processes.append(Process("prometheus", args, self.tmp / "prometheus.log"))

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = http_json(url)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"query {expr!r} failed: {exc.read().decode()}") from None
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"value": result}]
        return result

    def alerting_rules(self) -> list[dict[str, Any]]:
        groups = http_json(f"{self.prometheus}/api/v1/rules?type=alert")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def am_alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = http_json(f"{self.alertmanager}/api/v2/alerts")
        return alerts

    def hook_faults(self, *, source: str = "alertmanager") -> list[dict[str, Any]]:
        """Reports the hook accepted: from Alertmanager (via the webhook receiver) or from the daemon's outbox."""
        if not self.spool.exists():
            return []
        reports = [json.loads(line) for line in self.spool.read_text().splitlines() if line.strip()]
        from_am = [r for r in reports if "label.alertname" in r.get("evidence", {})]
        return from_am if source == "alertmanager" else [r for r in reports if r not in from_am]

    def inject(self, kind: str, gpu: int, *params: str) -> None:
        result = self.daemon.xpuctl("simulate", "inject", kind, "--gpu", str(gpu), *params)
        assert result.returncode == 0, result.stderr

    def stop(self) -> None:
        try:
            self.daemon.xpuctl("simulate", "clear")  # release hangs so the daemon stops promptly
        finally:
            for p in reversed(self.processes):
                p.stop()
            self.daemon.stop()
