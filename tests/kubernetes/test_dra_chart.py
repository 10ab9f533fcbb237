"""deploy/kubernetes/chart with the DRA driver on: per node either the device plugin or the DRA driver runs (never
both, and every daemon node gets one), the driver's DaemonSet mounts and passes what the driver needs, its RBAC is
exactly what it uses, and the DeviceClasses map the device plugin's whole-card resource."""

from __future__ import annotations

import functools
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.node_affinity import pod_fits
from tests.support.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
sys.path.insert(0, str(DEPLOY))

import chart_build as build  # noqa: E402
import chart_validate as validate  # noqa: E402

pytestmark = pytest.mark.deploy

DRA_ON = ("--set", "draDriver.enabled=true")
VARIANTS = {
    "plugin by default": DRA_ON,
    "dra by default, user affinity": ("-f", str(DEPLOY / "values-all-on.yaml")),
    "dra only": (*DRA_ON, "--set", "frontEnd.default=dra", "--set", "devicePlugin.enabled=false"),
    "plugin only": (),
}
LABEL = "xpu-runtime-kit.io/front-end"


def render(*args: str) -> list[dict[str, Any]]:
    return validate.documents(build.render(list(args)))


def named(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def daemonsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each DaemonSet's pod spec by the program it runs."""
    return {
        o["spec"]["template"]["spec"]["containers"][0]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] == "DaemonSet"
    }


@functools.cache
def rendered(variant: str) -> dict[str, dict[str, Any]]:
    return daemonsets(render(*VARIANTS[variant]))


nodes = st.fixed_dictionaries(
    {},
    optional={
        LABEL: st.sampled_from(["dra", "device-plugin", "DRA", ""]) | st.text(max_size=8),
        "nvidia.com/gpu.present": st.sampled_from(["true", "false"]),
        "nvidia.com/gpu.product": st.sampled_from(["NVIDIA-H200", "NVIDIA-H100"]),
        "example.com/zone": st.text(max_size=4),
    },
)


@pytest.mark.parametrize("variant", list(VARIANTS))
@given(labels=nodes, name=st.sampled_from(["gpu-a", "gpu-b"]))
def test_every_daemon_node_runs_exactly_one_front_end(variant: str, labels: dict[str, str], name: str) -> None:
    pods = rendered(variant)
    fits = {program: pod_fits(spec, name, labels) for program, spec in pods.items()}
    front_ends = [p for p in ("xpu-device-plugin", "xpu-dra-driver") if fits.get(p)]
    assert len(front_ends) <= 1, f"{variant}: {labels} runs {front_ends}"
    if {"xpu-device-plugin", "xpu-dra-driver"} <= set(pods):
        assert bool(front_ends) == fits["xpu-healthd"], f"{variant}: {labels}: daemon {fits['xpu-healthd']}"
    for program in front_ends:  # front ends only where the daemon runs, and they tolerate what it tolerates
        assert fits["xpu-healthd"]
        assert pods[program].get("tolerations") == pods["xpu-healthd"].get("tolerations")


def test_the_label_picks_the_front_end_and_the_default_covers_unlabelled_nodes() -> None:
    gpu = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H200"}

    def runs(variant: str, labels: dict[str, str]) -> set[str]:
        return {p for p, spec in rendered(variant).items() if pod_fits(spec, "n", labels)}

    daemon, plugin, dra = "xpu-healthd", "xpu-device-plugin", "xpu-dra-driver"
    for variant in ("plugin by default", "dra by default, user affinity"):
        assert runs(variant, {**gpu, LABEL: "dra"}) == {daemon, dra}
        assert runs(variant, {**gpu, LABEL: "device-plugin"}) == {daemon, plugin}
    assert runs("plugin by default", gpu) == {daemon, plugin}
    assert runs("dra by default, user affinity", gpu) == {daemon, dra}
    # the user's own affinity still applies to every program
    assert runs("dra by default, user affinity", {**gpu, "nvidia.com/gpu.product": "NVIDIA-H100"}) == set()
    assert runs("dra only", gpu) == {daemon, dra}
    assert runs("plugin only", {**gpu, LABEL: "dra"}) == {daemon}  # a DRA node without the driver: none
    with pytest.raises(RuntimeError, match=r"frontEnd\.default must be device-plugin or dra"):
        render("--set", "frontEnd.default=both")


def test_the_dra_daemonset_mounts_the_kubelet_and_daemon_directories() -> None:
    objects = render(*DRA_ON, "--set", "hostPaths.kubeletDir=/data/kubelet", "--set", "image.tag=1.2.3")
    pods = daemonsets(objects)
    pod = pods["xpu-dra-driver"]
    (driver,) = pod["containers"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m for m in driver["volumeMounts"]}
    assert {n: m["mountPath"] for n, m in mounts.items()} == host  # every host path at its own path inside
    assert host == {
        "runtime": "/run/xpu-runtime-kit",
        "plugins-registry": "/data/kubelet/plugins_registry",
        "plugin-dir": "/data/kubelet/plugins/gpu.xpu-runtime-kit.io",
        "cdi": "/var/run/cdi",
    }
    assert mounts["cdi"]["readOnly"] is True
    assert driver["command"] == [
        "xpu-dra-driver",
        "--healthd-socket=unix:/run/xpu-runtime-kit/healthd.sock",
        "--node-name=$(NODE_NAME)",
        "--kubelet-registry-dir=/data/kubelet/plugins_registry",
        "--kubelet-plugin-dir=/data/kubelet/plugins/gpu.xpu-runtime-kit.io",
    ]
    (env,) = driver["env"]
    assert env == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    daemon = pods["xpu-healthd"]["containers"][0]
    assert driver["image"] == daemon["image"] == "xpu-runtime-kit:1.2.3"
    daemon_runtime = next(m for m in daemon["volumeMounts"] if m["name"] == "runtime")["mountPath"]
    assert mounts["runtime"]["mountPath"] == daemon_runtime  # the daemon's sockets
    ctx = driver["securityContext"]
    assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"] and not ctx["privileged"]
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "xpu-runtime-kit-dra-driver"
    assert pods["xpu-healthd"]["automountServiceAccountToken"] is False
    assert pods["xpu-device-plugin"]["automountServiceAccountToken"] is False
    selectors = [o["spec"]["selector"]["matchLabels"] for o in objects if o["kind"] == "DaemonSet"]
    assert len({tuple(sorted(s.items())) for s in selectors}) == 3  # no DaemonSet selects another's pods
    assert named(objects, "Service")["spec"]["selector"]["app.kubernetes.io/name"] == "xpu-healthd"


def test_the_driver_may_do_exactly_what_it_needs() -> None:
    objects = render(*DRA_ON)
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    (role,) = roles
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    slices = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    assert granted == (
        {("resource.k8s.io", "resourceslices", v) for v in slices}
        | {("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")}
        | {("", "nodes", "get")}
    )
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no resourceNames games
    (binding,) = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "xpu-runtime-kit-dra-driver", "namespace": build.NAMESPACE}
    ]
    account = named(objects, "ServiceAccount", "-dra-driver")
    assert "automountServiceAccountToken" not in account
    assert not [o for o in render() if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "DeviceClass")]


def test_the_whole_card_class_serves_the_device_plugins_resource() -> None:
    classes = {o["metadata"]["name"]: o["spec"] for o in render(*DRA_ON) if o["kind"] == "DeviceClass"}
    assert sorted(classes) == ["gpu.xpu-runtime-kit.io", "mig.xpu-runtime-kit.io", "tdm.xpu-runtime-kit.io"]
    assert classes["gpu.xpu-runtime-kit.io"]["extendedResourceName"] == "xpu-runtime-kit.io/gpu"
    assert all("extendedResourceName" not in classes[n] for n in ("mig.xpu-runtime-kit.io", "tdm.xpu-runtime-kit.io"))
    unmapped = [o for o in render(*DRA_ON, "--set", "draDriver.extendedResourceName=") if o["kind"] == "DeviceClass"]
    assert all("extendedResourceName" not in o["spec"] for o in unmapped)


def test_the_schemas_check_the_dra_objects(tmp_path: Any) -> None:
    objects = render(*DRA_ON)
    device_class = named(objects, "DeviceClass", "gpu.xpu-runtime-kit.io")
    assert validate.check_core([device_class], "device class", tmp_path) == []
    device_class["spec"]["extendedResourceNames"] = device_class["spec"].pop("extendedResourceName")
    errors = validate.check_core([device_class], "broken", tmp_path)
    assert len(errors) == 2 and "1.36.0" in errors[0] and "1.37.0" in errors[1]  # the driver's: not on 1.29
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-dra-driver"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["path"] = "x"
    assert len(validate.check_core([daemonset], "broken", tmp_path)) == 2
    unknown = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceKlass", "metadata": {"name": "x"}, "spec": {}}
    errors = validate.check_core([unknown], "unknown kind", tmp_path)
    assert len(errors) == 2 and all("Couldn't find schema" in e for e in errors)


def test_the_admission_policy_keeps_the_driver_to_its_own_nodes_slices() -> None:
    from tests.support.admission_policy import decide

    objects = render(*DRA_ON)
    policy = named(objects, "ValidatingAdmissionPolicy")
    binding = named(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], sorted(rule["operations"])) == (["resourceslices"], ["CREATE", "DELETE", "UPDATE"])
    driver = "system:serviceaccount:xpu-runtime-kit:xpu-runtime-kit-dra-driver"

    def user(name: str, node: str | None) -> dict[str, Any]:
        return {"username": name, "extra": {"authentication.kubernetes.io/node-name": [node]} if node else {}}

    def slice_on(node: str | None, driver_name: str = "gpu.xpu-runtime-kit.io") -> dict[str, Any]:
        spec: dict[str, Any] = {"driver": driver_name, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
        spec.update({"nodeName": node} if node else {"allNodes": True})
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}

    def allowed(operation: str, who: dict[str, Any], obj: dict[str, Any]) -> bool:
        request = {"operation": operation, "userInfo": who}
        request.update({"oldObject": obj, "object": None} if operation == "DELETE" else {"object": obj})
        if operation == "UPDATE":
            request["oldObject"] = obj
        return decide(policy, request)[0]

    on_n1 = user(driver, "n1")
    for operation in ("CREATE", "UPDATE", "DELETE"):
        assert allowed(operation, on_n1, slice_on("n1"))
        assert not allowed(operation, on_n1, slice_on("n2"))
        assert not allowed(operation, on_n1, slice_on(None))  # a slice for all nodes
        assert not allowed(operation, on_n1, slice_on("n1", "gpu.nvidia.com"))  # another driver's
        assert not allowed(operation, user(driver, None), slice_on("n1"))  # a token not bound to a pod
    assert allowed("CREATE", user("system:node:n2", None), slice_on("n1"))  # others: RBAC's and kubelet's business
    message = decide(policy, {"operation": "CREATE", "userInfo": on_n1, "object": slice_on("n2")})[1]
    assert message == "the DRA driver on node n1 may write only that node's ResourceSlices"
    assert not [o for o in render(*DRA_ON, "--set", "draDriver.ownNodeOnly=false") if "Admission" in o["kind"]]
