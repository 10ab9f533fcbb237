"""The container image (packaging/build-image.sh, `./dev image`) with the real podman (Debian's 4.3.1, runtime runc):
it is built from the cached Debian tree and the .deb under test, holds both programs, and a container of it serves
/metrics of the simulated node. The tag it gets is the one the chart and the plain manifests name by default.

Podman's storage is private to the test (vfs driver in its tmp dir), so nothing lands in the host's image store.
Containers run with the host's network (to reach /metrics) and rlimits no higher than this process has (podman's
defaults fail without CAP_SYS_RESOURCE). Without root, or where the kernel forbids namespaces, the podman tests skip
with the reason; with XPU_DEB set (CI) missing tools are a failure, elsewhere a skip.

Not proven here: a Kubernetes node pulling it from a registry, or NVML inside it (no GPU; the NVIDIA container
runtime provides the driver there).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

import tests.support.nspawn as nspawn
from tests.support.debhelpers import deb_under_test
from tests.support.ports import free_port
from tests.support.servicehelpers import REPO
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.deb, pytest.mark.timeout(900)]

BUILD = REPO / "packaging" / "build-image.sh"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TOOLS = ("podman", "runc", "systemd-nspawn", "debootstrap", "tar")


@dataclass(frozen=True)
class Built:
    image: str
    podman: list[str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        command = [*self.podman, "run", "--rm", "--network", "host", "--security-opt", "apparmor=unconfined"]
        command += ["--security-opt", "label=disable", "--ulimit", f"nofile={limit}:{limit}"]
        command += ["--ulimit", f"nproc={limit}:{limit}", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _precondition() -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-nspawn and rootful podman need root")
    if missing := [t for t in TOOLS if shutil.which(t) is None]:
        message = f"not installed: {', '.join(missing)} (./dev test installs them)"
        if os.environ.get("XPU_DEB"):
            pytest.fail(message)
        pytest.skip(message)
    if (reason := nspawn.namespaces_forbidden()) is not None:
        pytest.skip(f"the kernel forbids namespaces: {reason}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    _precondition()
    deb = deb_under_test(tmp_path_factory)
    store = tmp_path_factory.mktemp("podman")
    podman = ["podman", "--root", str(store / "storage"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]
    podman += ["--events-backend", "none", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
    env = {**os.environ, "XPU_DEB": str(deb), "PODMAN": " ".join(podman)}
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=900, check=False, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr.strip().splitlines()[-1])  # "built xpu-runtime-kit:<version> (N MiB) in N s"
    return Built(done.stdout.strip().splitlines()[-1], podman)


def test_the_image_holds_both_programs(built: Built) -> None:
    assert built.image == f"xpu-runtime-kit:{VERSION}"
    script = (
        "for p in xpu-healthd xpu-device-plugin xpuctl; do command -v $p; done;"
        " xpu-healthd --version; xpu-device-plugin --help"
    )
    done = built.run(built.image, "sh", "-c", script)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["/usr/bin/xpu-healthd", "/usr/bin/xpu-device-plugin", "/usr/bin/xpuctl"]
    assert lines[3] == f"xpu-healthd {VERSION}"
    assert "--healthd-socket" in done.stdout
    inspect = subprocess.run(
        [*built.podman, "image", "inspect", "--format", "{{json .Config.Cmd}}", built.image],
        capture_output=True,
        text=True,
        check=True,
    )
    assert inspect.stdout.strip() == '["xpu-healthd","--config","/etc/xpu-runtime-kit/healthd.toml"]'


@pytest.fixture
def serving(built: Built) -> Iterator[int]:
    port = free_port()
    name = f"xpu-image-test-{port}"
    started = built.run(
        "-d", "--name", name, built.image, "xpu-healthd", "--simulate", "--metrics-listen", f"127.0.0.1:{port}",
        "--grpc-listen", "unix:/tmp/healthd.sock", "--state-dir", "/tmp/state",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield port
    finally:
        logs = subprocess.run([*built.podman, "logs", name], capture_output=True, text=True, check=False)
        print(logs.stdout[-2000:] + logs.stderr[-2000:])
        subprocess.run([*built.podman, "rm", "-f", "-t", "5", name], capture_output=True, check=False, timeout=60)


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_a_container_serves_metrics_of_the_simulated_node(serving: int) -> None:
    def all_cards() -> str:
        text = _metrics(serving)
        return text if 'xpu_gpu_up{gpu="7"' in text else ""

    text = wait_until(all_cards, "/metrics with all 8 cards", 60)
    assert "xpu_gpus 8.0" in text
    assert len(re.findall(r'^xpu_gpu_up\{gpu="\d".*\} 1\.0$', text, flags=re.MULTILINE)) == 8
    assert 'model="NVIDIA H200"' in text


def test_the_chart_and_the_manifests_name_the_built_tag() -> None:
    """One source of truth: pyproject's version is the chart's appVersion, the tag of the default image."""
    chart = yaml.safe_load((REPO / "deploy/kubernetes/chart/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "deploy/kubernetes/chart/values.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert values["image"]["repository"] == "xpu-runtime-kit" and values["image"]["tag"] == ""  # "": appVersion
    manifests = (REPO / "deploy/kubernetes/manifests/xpu-runtime-kit.yaml").read_text()
    images = re.findall(r"^\s+image: (\S+)$", manifests, flags=re.MULTILINE)
    assert images and set(images) == {f"xpu-runtime-kit:{VERSION}"}
    assert re.search(r"^IMAGE=xpu-runtime-kit:\$VERSION$", BUILD.read_text(), flags=re.MULTILINE)
