"""The CDI spec: structure per the CDI spec (0.6), one device per ready partition, atomic replacement."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from healthd.partition.cdi import CDI_KIND, SPEC_FILE, CdiWriter, build_spec, device_name
from healthd.partition.edits import ContainerEdits, Mount, mig_cap_minors

NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$")  # CDI device name rule
KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")


def edits(i: int) -> ContainerEdits:
    return ContainerEdits(
        env={"CUDA_VISIBLE_DEVICES": f"GPU-{i}", "CUDA_MPS_PIPE_DIRECTORY": f"/run/x/mps/p-{i}/pipe"},
        mounts=(Mount(f"/run/x/mps/p-{i}/pipe", f"/run/x/mps/p-{i}/pipe"),),
        device_nodes=("/dev/nvidiactl", f"/dev/nvidia{i}"),
    )


def check_spec(spec: dict[str, object]) -> None:
    assert set(spec) <= {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
    assert spec["cdiVersion"] == "0.6.0"
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
        assert all(n["path"].startswith("/dev/") for n in ce.get("deviceNodes", []))
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


def test_mig_capability_minors_from_proc(tmp_path: Path) -> None:
    caps = tmp_path / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    lines = ["config 1", "monitor 2", "gpu0/gi1/access 3", "gpu0/gi1/ci0/access 4", "gpu1/gi1/access 12"]
    (caps / "mig-minors").write_text("\n".join(lines) + "\n")
    assert mig_cap_minors(tmp_path, 0, 1, 0) == (3, 4)
    assert mig_cap_minors(tmp_path, 1, 1, 0) == (12,)
    assert mig_cap_minors(tmp_path / "nope", 0, 1, 0) == ()
