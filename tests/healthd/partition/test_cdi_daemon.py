"""The simulated daemon's CDI spec: real-looking device numbers from its simulated driver tables (MIG capability
nodes included), the lowest cdiVersion, no driver libraries; and the wiring of [partitions] cdi_driver_libraries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.backends.simulated import SimulatedBackend
from healthd.api.v1 import partitions_pb2 as pb
from healthd.api.v1 import partitions_pb2_grpc as pb_grpc
from healthd.daemon.config import Config
from healthd.daemon.daemon import Daemon
from healthd.host.simulated_devices import gpu_instance_minor
from healthd.host.view import HostSettings
from healthd.partition import component
from healthd.partition.edits import ContainerEdits, Mount
from healthd.partition.settings import PartitionSettings
from tests.support.partitions import partitions_on

LEASE = pb.Owner(lease=pb.LeaseOwner(holder="t"))


def test_simulated_daemon_spec_carries_device_numbers(
    tmp_path: Path, simulated_config: Callable[[Config], Config]
) -> None:
    config = simulated_config(Config())

    async def go() -> tuple[Any, Any]:
        daemon = Daemon(config, allow_fallback=True)
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path}/healthd-admin.sock") as ch:
                stub = pb_grpc.PartitionsStub(ch)  # type: ignore[no-untyped-call]
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="2", mode=pb.PARTITION_MODE_TDM))
                tdm = await stub.CreatePartition(pb.CreatePartitionRequest(owner=LEASE, gpu="2", memory="1GiB"))
                await stub.SetCardMode(pb.SetCardModeRequest(gpu="6", mode=pb.PARTITION_MODE_MIG))
                mig = await stub.CreatePartition(pb.CreatePartitionRequest(owner=LEASE, gpu="6", compute_percent=10))
                return tdm, mig
        finally:
            await daemon.stop()

    tdm, mig = asyncio.run(go())
    spec = json.loads((tmp_path / "state" / "cdi" / "xpu-runtime-kit.io-gpu.json").read_text())
    assert spec["cdiVersion"] == "0.3.0"
    # a simulated node hands out no host driver libraries: the spec's own edits are the legacy-runtime guard only
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    envs = {d["name"]: d["containerEdits"].get("env", []) for d in spec["devices"]}
    assert f"CUDA_VISIBLE_DEVICES={mig.mig.uuid}" in envs[mig.id]
    legacy = {name: e for name, env in envs.items() for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")}
    assert legacy == {}, "only the spec's own NVIDIA_VISIBLE_DEVICES=void: a legacy runtime must add no card again"
    assert {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2, "fileMode": 0o666} in devices[tdm.id]
    gi_minor = gpu_instance_minor(6, mig.mig.gpu_instance_id)
    caps = [n for n in devices[mig.id] if n["path"].startswith("/dev/nvidia-caps/")]
    ci_minor = gi_minor + 1 + mig.mig.compute_instance_id
    assert caps == [
        {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": 241, "minor": m, "fileMode": 0o444}
        for m in (gi_minor, ci_minor)
    ]
    minors = (tmp_path / "state" / "simulated-driver" / "proc" / "driver" / "nvidia-caps" / "mig-minors").read_text()
    assert f"gpu6/gi{mig.mig.gpu_instance_id}/access {gi_minor}\n" in minors
    # the gRPC answer lists the same nodes by path
    assert [n.path for n in mig.device_nodes] == [n["path"] for n in devices[mig.id]]


class RealLookingBackend:
    """Not a SimulatedBackend: the wiring must treat it as real GPUs (nothing here is called before start)."""

    name = "real-looking"


@pytest.mark.parametrize(("setting", "calls"), [("auto", 1), ("off", 0)])
def test_driver_libraries_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, calls: int) -> None:
    found = ContainerEdits(mounts=(Mount("/usr/lib/libcuda.so.580.95.05", "/usr/lib/libcuda.so.1", ("ro",)),))
    seen: list[int] = []

    def discover() -> ContainerEdits:
        seen.append(1)
        return found

    monkeypatch.setattr(component, "discover_driver_edits", discover)
    settings = PartitionSettings(cdi_driver_libraries=setting, runtime_dir=tmp_path / "run")
    host = HostSettings(cdi_dir=tmp_path / "cdi")
    parts = partitions_on(RealLookingBackend(), tmp_path / "state", settings, host=host)  # type: ignore[arg-type]
    try:
        assert len(seen) == calls
        assert parts.manager.cdi.common is (found if calls else None)
    finally:
        parts.store.close()


def test_simulated_node_never_discovers_host_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(component, "discover_driver_edits", lambda: pytest.fail("looked at the host's libraries"))
    backend = SimulatedBackend.from_name("h200x1")
    parts = partitions_on(backend, tmp_path / "state", PartitionSettings(runtime_dir=tmp_path / "run"))
    try:
        assert parts.manager.cdi.common is None
        assert parts.devices.proc_root == tmp_path / "state" / "simulated-driver" / "proc"
    finally:
        parts.store.close()
