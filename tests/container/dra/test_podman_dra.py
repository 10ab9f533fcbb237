"""The DRA path into a real container: a claim is allocated (as the scheduler writes it), kubelet's double prepares
it through xpu-dra-driver, podman runs a busybox container with the CDI ids the driver returned (what kubelet hands
the runtime), the container sees the TDM quota environment or the MIG instance, then unprepare removes the
partition and the daemon's CDI spec no longer lists it.

The container runs with the helpers of tests/healthd/partition/test_podman_cdi.py (podman in a private mount
namespace whose /var/run/cdi is the daemon's spec directory); ``run_in_container`` reads only the work, spec and
rootfs directories of the object it is given. Not proven here: kubelet and containerd/CRI-O passing the ids on
(kubelet forwards NodePrepareResources' cdi_device_ids to the runtime as CDI devices, KEP-4009)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from healthd.api.v1 import partitions_pb2 as ppb
from tests.healthd.partition.standins import build_busybox_rootfs
from tests.healthd.partition.test_podman_cdi import PROBE, TOOLS, _cannot_run, run_in_container
from tests.support import dra_allocations as alloc
from tests.support.dra_stack import DRIVER, NODE, DraStack, dra_stack
from tests.support.kubelet_dra import Claim
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

POD = ("inference", "0f0e0d0c-0000-4000-8000-000000000002")
KIND = "xpu-runtime-kit.io/gpu="


@dataclass
class Site:
    """What run_in_container needs: podman's work dir, the CDI spec dir it reads, the container's root fs."""

    work: Path
    cdi_dir: Path
    rootfs: Path


def spec_devices(stack: DraStack) -> set[str]:
    spec = json.loads((stack.daemon.tmp / "state" / "cdi" / "xpu-runtime-kit.io-gpu.json").read_text())
    return {d["name"] for d in spec["devices"]}


def test_claims_into_podman_containers_and_back(tmp_path: Path) -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"not installed: {', '.join(missing)} (./dev test installs them)"
    if (reason := _cannot_run()) is not None:
        pytest.skip(reason)
    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "probe.sh").write_text(PROBE)
    modes = {"3": ppb.PARTITION_MODE_TDM, "6": ppb.PARTITION_MODE_MIG}
    (tmp_path / "stack").mkdir()
    with dra_stack(tmp_path / "stack", driver_config="refresh_seconds = 0.5\n", modes=modes) as stack:
        wait_until(stack.register, "registered", 30)
        wait_until(lambda: {"gpu-3-tdm", "gpu-6-mig-2g-35gb-2"} <= set(stack.devices()), "published", 30)
        site = Site(tmp_path / "podman", stack.daemon.tmp / "state" / "cdi", rootfs)

        def add(claim: dict[str, object]) -> Claim:
            made = stack.api.add("resourceclaims", claim, namespace="ml")
            return Claim("ml", made["metadata"]["uid"], made["metadata"]["name"])

        tdm = add(alloc.tdm_share("tdm", "ml", NODE, "gpu-3-tdm", POD, compute="30", memory="2Gi"))
        mig = add(alloc.mig_partition("mig", "ml", NODE, "gpu-6-mig-2g-35gb-2", POD))
        prepared = stack.kubelet.prepare(DRIVER, [tdm, mig])
        (tdm_id,) = prepared[tdm.uid][0].cdi_device_ids
        (mig_id,) = prepared[mig.uid][0].cdi_device_ids
        partitions = {p.cdi_device: p for p in stack.partitions()}

        seen = run_in_container(site, tdm_id.removeprefix(KIND))  # type: ignore[arg-type]
        assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert seen.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G"
        assert seen.env["CUDA_VISIBLE_DEVICES"] == partitions[tdm_id].gpu_uuid
        assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] in seen.mounts
        assert "/dev/nvidia3" in seen.devices

        seen = run_in_container(site, mig_id.removeprefix(KIND))  # type: ignore[arg-type]
        instance = partitions[mig_id].mig
        assert (instance.profile, instance.placement_start) == ("2g.35gb", 2)
        assert seen.env["CUDA_VISIBLE_DEVICES"] == instance.uuid
        assert "CUDA_MPS_PIPE_DIRECTORY" not in seen.env
        assert "/dev/nvidia6" in seen.devices
        assert any("nvidia-caps/nvidia-cap" in p for p in seen.devices)

        names = {tdm_id.removeprefix(KIND), mig_id.removeprefix(KIND)}
        assert names <= spec_devices(stack)
        stack.kubelet.unprepare(DRIVER, [tdm, mig])
        assert stack.partitions() == []
        assert not names & spec_devices(stack)
