"""The scrape configs in docs/attribution.md are valid, and honor_labels does what the doc says, on the real
Prometheus binary."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.ports import free_port

DOC = REPO / "docs" / "attribution.md"
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
K8S_SD = re.compile(r"    kubernetes_sd_configs:\n      - role: \w+\n")


def _blocks() -> list[str]:
    return YAML_BLOCK.findall(DOC.read_text())


def test_doc_has_the_three_scrape_configs() -> None:
    blocks = _blocks()
    assert len(blocks) == 3
    assert "honor_labels: true" in blocks[0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("index", range(3))
def test_scrape_config_examples_pass_promtool(index: int, tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    text = _blocks()[index]
    config.write_text(text)
    out = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    if "field kubernetes_sd_configs not found" in out.stdout + out.stderr:
        # Debian builds Prometheus without Kubernetes discovery: check everything else with a static target
        text = K8S_SD.sub("    static_configs:\n      - targets: ['node-1:9410']\n", text)
        config.write_text(text)
        out = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


EXPOSITION = (
    b"# TYPE xpu_process_gpu_memory_used_bytes gauge\n"
    b'xpu_process_gpu_memory_used_bytes{gpu="0",pid="1",pod="",namespace=""} 1\n'
    b'xpu_process_gpu_memory_used_bytes{gpu="1",pid="2",pod="train-0",namespace="ml"} 2\n'
)


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(EXPOSITION)))
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_honor_labels_keeps_our_pod_and_never_fills_in_the_targets(exporter: int, tmp_path: Path) -> None:
    web = free_port()
    target = {"targets": [f"127.0.0.1:{exporter}"], "labels": {"pod": "exporter-pod", "namespace": "monitoring"}}
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "honor", "honor_labels": True, "static_configs": [target]},
            {"job_name": "default", "static_configs": [target]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    with (tmp_path / "prometheus.log").open("wb") as log:
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        series: list[dict[str, str]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(series) < 4:
            time.sleep(0.5)
            try:
                url = f"http://127.0.0.1:{web}/api/v1/query?query=xpu_process_gpu_memory_used_bytes"
                with urllib.request.urlopen(url, timeout=5) as r:
                    series = [x["metric"] for x in json.load(r)["data"]["result"]]
            except OSError:
                continue
        by = {(s["job"], s["gpu"]): s for s in series}
        assert len(by) == 4, series
        # honor_labels: ours win; the unattributed process gets no pod at all, not the exporter's
        assert by[("honor", "1")]["pod"] == "train-0"
        assert "pod" not in by[("honor", "0")]
        assert "namespace" not in by[("honor", "0")]
        # default settings: ours renamed, and the unattributed process shows the exporter's pod
        assert by[("default", "1")]["exported_pod"] == "train-0"
        assert by[("default", "1")]["pod"] == "exporter-pod"
        assert by[("default", "0")]["pod"] == "exporter-pod"
    finally:
        prom.terminate()
        prom.wait(20)
