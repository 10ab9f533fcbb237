"""The daemon in simulation: simulated processes in simulated pods show matching process and pod series, and
they vanish when the processes exit. Starts xpu-healthd as a process and drives it with xpuctl."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import REPO
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = REPO


class Daemon:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.sock = f"unix:{tmp}/h.sock"
        config = tmp / "healthd.toml"
        config.write_text(
            f'[daemon]\nsimulate = "h200x8"\nmetrics_listen = "127.0.0.1:{self.port}"\n'
            f'grpc_listen = "{self.sock}"\nstate_dir = "{tmp}/state"\n'
            "[sampler]\ninterval_seconds = 0.2\n"
            "[attribution]\nrefresh_interval_seconds = 0.5\nmax_processes_per_gpu = 8\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = tmp / "daemon.log"
        with self.log.open("wb") as out:  # a file, not a pipe: a chatty daemon must never block on a full pipe
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "healthd", "--config", str(config)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    def xpuctl(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "healthd.cli", "--socket", self.sock, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def wait_for(self, check: object, timeout: float = 20.0) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        deadline = time.monotonic() + timeout
        last: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                last = self.metrics()
            except OSError:
                time.sleep(0.1)
                continue
            if check(last):  # type: ignore[operator]
                return last
            time.sleep(0.1)
        raise AssertionError(f"condition not met in {timeout}s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    tmp = Path(f"/tmp/xpu-e2e-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    tmp.mkdir()
    d = Daemon(tmp)
    yield d
    d.stop()
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


def _labels(
    series: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **want: str
) -> list[dict[str, str]]:
    return [dict(k) for (n, k) in series if n == name and set(want.items()) <= k]


def test_simulated_pods_process_and_pod_series_match_and_vanish(daemon: Daemon) -> None:
    s = daemon.wait_for(lambda m: _labels(m, "xpu_pod_gpu_allocated", pod="triton-0"))
    # every simulated process has a pod, and each pod's usage is the sum of its own processes
    procs = _labels(s, "xpu_process_gpu_memory_used_bytes")
    assert len(procs) == 8
    assert all(p["pod"] and p["namespace"] and p["container"] for p in procs)
    for p in procs:
        key = {k: p[k] for k in ("namespace", "pod", "container", "uuid", "gpu_instance_id") if k in p}
        pod_value = s[("xpu_pod_gpu_memory_used_bytes", frozenset(key.items()))]
        assert pod_value == s[("xpu_process_gpu_memory_used_bytes", frozenset(p.items()))]

    out = daemon.xpuctl(
        "simulate", "inject", "process_start", "--gpu", "6", "pid=77001", "name=train", "pod=ft-0", "namespace=team-a"
    )
    assert "ft-0" in out
    daemon.xpuctl("simulate", "inject", "process_start", "--gpu", "6", "pid=77002", "name=eval", "pod=ft-0")
    # in one CI run the new process showed for a moment without its pod (attribution catches up with a new pod a
    # cycle or more late; not pinned down): wait for the state the assertions below check
    s = daemon.wait_for(
        lambda m: (
            _labels(m, "xpu_pod_gpu_allocated", pod="ft-0")
            and _labels(m, "xpu_process_gpu_memory_used_bytes", pid="77002", pod="ft-0", namespace="default")
        )
    )
    assert _labels(
        s, "xpu_process_gpu_memory_used_bytes", pid="77001", pod="ft-0", namespace="team-a", container="main"
    )
    assert _labels(s, "xpu_process_gpu_memory_used_bytes", pid="77002", pod="ft-0", namespace="default")
    assert (
        s[
            (
                "xpu_pod_gpu_processes",
                frozenset(
                    {
                        "namespace": "team-a",
                        "pod": "ft-0",
                        "container": "main",
                        "uuid": _labels(s, "xpu_gpu_up", gpu="6")[0]["uuid"],
                    }.items()
                ),
            )
        ]
        == 1.0
    )

    daemon.xpuctl("simulate", "inject", "process_exit", "--gpu", "6", "pid=77001")
    daemon.xpuctl("simulate", "inject", "process_exit", "--gpu", "6", "pid=77002")
    s = daemon.wait_for(
        lambda m: (
            not _labels(m, "xpu_process_gpu_memory_used_bytes", uuid=_labels(m, "xpu_gpu_up", gpu="6")[0]["uuid"])
            and not _labels(m, "xpu_pod_gpu_allocated", pod="ft-0")
        )
    )
    assert not _labels(s, "xpu_pod_gpu_memory_used_bytes", pod="ft-0")
    assert _labels(s, "xpu_process_gpu_memory_used_bytes", pod="triton-0")  # the others are untouched
    assert s[("xpu_collector_success", frozenset({("collector", "process")}))] == 1.0
    assert s[("xpu_collector_success", frozenset({("collector", "pod")}))] == 1.0
