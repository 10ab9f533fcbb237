"""The CDI spec: structure per the CDI spec, the lowest cdiVersion its content needs (the CDI reference library's
rule), one device per ready partition, spec-level driver edits, atomic replacement."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from healthd.host.devices import DeviceNode
from healthd.partition.cdi import CDI_KIND, SPEC_FILE, CdiWriter, build_spec, device_name, minimum_version
from healthd.partition.edits import ContainerEdits, Hook, Mount

NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$")  # CDI device name rule
KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")


def edits(i: int) -> ContainerEdits:
    return ContainerEdits(
        env={"CUDA_VISIBLE_DEVICES": f"GPU-{i}", "CUDA_MPS_PIPE_DIRECTORY": f"/run/x/mps/p-{i}/pipe"},
        mounts=(Mount(f"/run/x/mps/p-{i}/pipe", f"/run/x/mps/p-{i}/pipe"),),
        device_nodes=(DeviceNode("/dev/nvidiactl", 195, 255, 0o666), DeviceNode(f"/dev/nvidia{i}")),
    )


def check_spec(spec: dict[str, object]) -> None:
    assert set(spec) <= {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
    assert spec["cdiVersion"] == "0.3.0"  # what Debian 12's podman 4.3.1 (CDI loader 0.5) accepts
    assert isinstance(spec["kind"], str)
    assert KIND.match(spec["kind"])
    devices = spec["devices"]
    assert isinstance(devices, list)
    assert devices
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))
    for d in devices:
        assert set(d) <= {"name", "annotations", "containerEdits"}
        assert NAME.match(d["name"])
        ce = d["containerEdits"]
        assert set(ce) <= {"env", "deviceNodes", "mounts", "hooks", "additionalGids"}
        assert all("=" in e for e in ce.get("env", []))
        for n in ce.get("deviceNodes", []):
            assert n["path"].startswith("/dev/")
            assert set(n) <= {"path", "type", "major", "minor", "fileMode"}
            if "major" in n:  # the runtime creates the node from these without looking at the host
                assert n["type"] == "c"
                assert isinstance(n["minor"], int)
        for m in ce.get("mounts", []):
            assert m["hostPath"].startswith("/")
            assert m["containerPath"].startswith("/")


def test_spec_structure_and_names() -> None:
    spec = build_spec([("p-2", edits(2)), ("p-1", edits(1))])
    check_spec(spec)
    assert spec["kind"] == CDI_KIND == "xpu-runtime-kit.io/gpu"
    assert [d["name"] for d in spec["devices"]] == ["p-1", "p-2"]
    assert device_name("p-1") == "xpu-runtime-kit.io/gpu=p-1"


def test_write_replaces_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    writer = CdiWriter(tmp_path / "cdi")
    seen_bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                text = (tmp_path / "cdi" / SPEC_FILE).read_text()
            except FileNotFoundError:
                continue
            try:
                check_spec(json.loads(text))
            except (ValueError, AssertionError) as exc:
                seen_bad.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    for n in range(1, 150):
        writer.write([(f"p-{i}", edits(i)) for i in range(n % 17 + 1)])
    stop.set()
    thread.join()
    assert seen_bad == []  # a reader never sees a half-written spec
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [SPEC_FILE]
    assert (tmp_path / "cdi" / SPEC_FILE).stat().st_mode & 0o777 == 0o644


def test_no_partitions_means_no_spec_file(tmp_path: Path) -> None:
    writer = CdiWriter(tmp_path)
    writer.write([("p-1", edits(1))])
    assert (tmp_path / SPEC_FILE).exists()
    writer.write([])
    assert not (tmp_path / SPEC_FILE).exists()  # CDI requires at least one device per spec


def test_spec_structure_keeps_device_numbers() -> None:
    spec = build_spec([("p-1", edits(1))])
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 0o666},
        {"path": "/dev/nvidia1"},  # a node without numbers: listed by path only
    ]


def test_driver_edits_sit_at_spec_level_and_keep_the_version() -> None:
    lib = Mount("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", ("ro",))
    hook = Hook("createContainer", "/opt/x/bin/xpu-cdi-hook", ("xpu-cdi-hook", "update-ldcache", "--folder", "/usr"))
    spec = build_spec([("p-1", edits(1))], ContainerEdits(mounts=(lib,), hooks=(hook,)))
    check_spec(spec)
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [{"hostPath": lib.host_path, "containerPath": lib.container_path, "options": ["ro"]}],
        "hooks": [{"hookName": "createContainer", "path": hook.path, "args": list(hook.args)}],
    }
    assert [m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]] == ["/run/x/mps/p-1/pipe"]


def test_no_edit_lets_a_legacy_runtime_add_a_card_twice() -> None:
    """Like nvidia-ctk's specs: NVIDIA_VISIBLE_DEVICES=void for the whole spec, and no device names a card there, so
    a legacy nvidia-container-runtime (prestart hook, reads that variable) injects nothing beside the spec's nodes.
    CUDA_VISIBLE_DEVICES (what CUDA reads) still names the partition's card or MIG device."""
    spec = build_spec([("p-1", edits(1)), ("GPU-0000", ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),)))])
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    for device in spec["devices"]:
        env = device["containerEdits"].get("env", [])
        assert not [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")], (device["name"], env)


def base_spec() -> dict[str, Any]:
    return {
        "cdiVersion": "0.3.0",
        "kind": "xpu-runtime-kit.io/gpu",
        "devices": [{"name": "p-1", "containerEdits": {"env": ["A=1"], "deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    }


def with_(spec: dict[str, Any], where: str, key: str, value: Any) -> dict[str, Any]:
    if where == "spec":
        spec[key] = value
    elif where == "spec-edits":
        spec.setdefault("containerEdits", {})[key] = value
    elif where == "device":
        spec["devices"][0][key] = value
    else:
        spec["devices"][0]["containerEdits"][key] = value
    return spec


@pytest.mark.parametrize(
    ("change", "version"),
    [
        (lambda s: s, "0.3.0"),
        # hooks, typed device nodes and mount options are all 0.3.0 features
        (lambda s: with_(s, "edits", "hooks", [{"hookName": "createContainer", "path": "/bin/true"}]), "0.3.0"),
        (lambda s: with_(s, "edits", "mounts", [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), "0.4.0"),
        (lambda s: with_(s, "spec-edits", "mounts", [{"hostPath": "/a", "containerPath": "/a", "type": "b"}]), "0.4.0"),
        (lambda s: with_(s, "edits", "deviceNodes", [{"path": "/dev/x", "hostPath": "/tmp/x"}]), "0.5.0"),
        (lambda s: with_(s, "device", "name", "0"), "0.5.0"),
        (lambda s: with_(s, "device", "annotations", {"a": "b"}), "0.6.0"),
        (lambda s: with_(s, "spec", "annotations", {"a": "b"}), "0.6.0"),
        (lambda s: with_(s, "spec", "kind", "vendor.com/gpu.shared"), "0.6.0"),
        (lambda s: with_(s, "edits", "additionalGids", [44]), "0.7.0"),
        (lambda s: with_(s, "spec-edits", "intelRdt", {"closID": "x"}), "0.7.0"),
        (lambda s: with_(s, "edits", "netDevices", [{"hostInterfaceName": "eth1", "name": "net1"}]), "1.1.0"),
        (lambda s: with_(s, "edits", "intelRdt", {"enableMonitoring": True}), "1.1.0"),
        # several features: the newest wins
        (
            lambda s: with_(with_(s, "device", "annotations", {"a": "b"}), "device", "name", "7"),
            "0.6.0",
        ),
        (
            lambda s: with_(with_(s, "edits", "additionalGids", [1]), "spec-edits", "mounts", [{"type": "x"}]),
            "0.7.0",
        ),
    ],
)
def test_minimum_version_follows_the_reference_rule(change: Any, version: str) -> None:
    assert minimum_version(change(base_spec())) == version


def test_version_rule_covers_devices_of_any_origin() -> None:
    whole_card = ContainerEdits(env={"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, device_nodes=(DeviceNode("/dev/nvidia1"),))
    assert build_spec([("p-1", edits(1)), ("GPU-0000", whole_card)])["cdiVersion"] == "0.3.0"
    # a device named by index (starts with a digit) needs 0.5.0 whoever added it
    assert build_spec([("p-1", edits(1)), ("1", whole_card)])["cdiVersion"] == "0.5.0"
