"""deploy/kubernetes: the chart and plain manifests pass real validators (helm, kubernetes-validate, the Prometheus
Operator schemas, promtool), the generated files are current, and the PrometheusRule is the alerts file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
sys.path.insert(0, str(DEPLOY))

import chart_build as build  # noqa: E402  (module names unique in the test process: dashboards/ has a build.py)
import chart_validate as validate  # noqa: E402

pytestmark = pytest.mark.deploy


def test_generated_files_are_current() -> None:
    out = subprocess.run([sys.executable, str(DEPLOY / "chart_build.py"), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_chart_and_manifests_pass_the_validators() -> None:
    out = subprocess.run(
        [sys.executable, str(DEPLOY / "chart_validate.py")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all valid" in out.stdout
    assert out.stdout.count("objects") == 3  # two chart variants and the plain manifests


def rendered(*args: str) -> dict[str, dict[str, Any]]:
    """The objects by kind (a second one of a kind as kind/name), each DaemonSet by the program it runs."""
    out = {}
    for d in validate.documents(build.render(list(args))):
        key = d["kind"] if d["kind"] != "DaemonSet" else d["spec"]["template"]["spec"]["containers"][0]["name"]
        out[key if key not in out else f"{key}/{d['metadata']['name']}"] = d
    return out


def test_prometheus_rule_is_the_alerts_file() -> None:
    alerts = yaml.safe_load((REPO / "alerts" / "xpu-healthd.rules.yml").read_text())
    rule = rendered()["PrometheusRule"]
    assert rule["spec"]["groups"] == alerts["groups"]
    assert "{{ $labels.gpu }}" in yaml.safe_dump(rule["spec"])  # Prometheus' templates pass through helm untouched


def test_the_daemon_and_the_plugin_share_sockets_and_host_paths() -> None:
    objects = rendered()
    pods = {name: objects[name]["spec"]["template"]["spec"] for name in ("xpu-healthd", "xpu-device-plugin")}
    (daemon,), (plugin,) = pods["xpu-healthd"]["containers"], pods["xpu-device-plugin"]["containers"]
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (daemon, plugin)}
    host = {
        name: {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        for name, pod in pods.items()
    }
    assert mounts["xpu-healthd"]["runtime"] == mounts["xpu-device-plugin"]["runtime"] == host["xpu-healthd"]["runtime"]
    assert host["xpu-healthd"]["runtime"] == host["xpu-device-plugin"]["runtime"]
    # CDI specs and MPS pipes name host paths: mounted at the same path inside
    for name in ("cdi", "runtime", "state"):
        assert mounts["xpu-healthd"][name] == host["xpu-healthd"][name]
    assert (
        mounts["xpu-device-plugin"]["device-plugins"]
        == host["xpu-device-plugin"]["device-plugins"]
        == "/var/lib/kubelet/device-plugins"
    )
    assert "--healthd-socket=unix:/run/xpu-runtime-kit/healthd.sock" in plugin["command"]
    for container in (daemon, plugin):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"] and not ctx["privileged"]
        assert ctx["capabilities"]["drop"] == ["ALL"]
    assert daemon["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN", "CHOWN", "SYSLOG"]
    assert "add" not in plugin["securityContext"]["capabilities"]
    assert all(pod["automountServiceAccountToken"] is False for pod in pods.values())
    assert "xpu-dra-driver" not in objects  # off by default
    monitor = objects["ServiceMonitor"]["spec"]
    assert monitor["jobLabel"] == "app.kubernetes.io/name"
    assert objects["Service"]["metadata"]["labels"]["app.kubernetes.io/name"] == "xpu-healthd"  # job="xpu-healthd"


def test_each_pod_restarts_when_its_own_config_changes() -> None:
    def checksums(*args: str) -> dict[str, str]:
        objects = rendered(*args)
        return {
            name: objects[name]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for name in ("xpu-healthd", "xpu-device-plugin")
        }

    base = checksums()
    plugin_changed = checksums("--set", "devicePlugin.leaseSeconds=300")
    daemon_changed = checksums("--set", "daemon.logLevel=debug")
    assert plugin_changed["xpu-healthd"] == base["xpu-healthd"] != daemon_changed["xpu-healthd"]
    assert daemon_changed["xpu-device-plugin"] == base["xpu-device-plugin"] != plugin_changed["xpu-device-plugin"]


def test_values_reach_the_plugin_config() -> None:
    objects = rendered("-f", str(DEPLOY / "values-all-on.yaml"))
    plugin_toml = objects["ConfigMap"]["data"]["plugin.toml"]
    assert 'shapes = [{compute_percent = 25, memory = "32GiB"}, {compute_percent = 10, memory = "1536MiB"}]' in (
        plugin_toml
    )
    assert 'profiles = ["1g.18gb", "3g.71gb"]' in plugin_toml
    assert "whole_cards = false" in plugin_toml
    assert 'kmsg_path = "/dev/kmsg"' in objects["ConfigMap"]["data"]["healthd.toml"]


def test_the_validators_reject_broken_objects(tmp_path: Path) -> None:
    objects = rendered()
    daemonset, plugin = objects["xpu-healthd"], objects["xpu-device-plugin"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = "yes"
    plugin["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    errors = validate.check_core([daemonset, plugin], "broken", tmp_path)
    assert len(errors) == 3 and all("privileged" in e and "bogusField" in e for e in errors)  # 1.36, 1.37, 1.29
    monitor = objects["ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    rule = objects["PrometheusRule"]
    rule["spec"]["groups"][0]["rules"][0]["for"] = "a while"
    errors = validate.check_crds([monitor, rule], "broken")
    assert errors and "ServiceMonitor" in errors[0] and "PrometheusRule" in errors[0]
    rule["spec"]["groups"][0]["rules"][0]["for"] = "1m"
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(("
    assert validate.check_rules([rule], "broken", tmp_path)
    config = objects["ConfigMap"]
    config["data"]["plugin.toml"] += "\nbogus = 1\n"
    assert validate.check_configs([config], "broken", tmp_path)
