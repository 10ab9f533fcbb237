"""xpu-dra-driver end to end on the simulated h200x8 node: the daemon and the driver as processes, the API server
stand-in (every slice written is validated against the 1.36 and 1.37 strict schemas), claims in the shapes the
scheduler writes (tests/support/dra_allocations.py) and the kubelet DRA double calling the driver as kubelet does.

Covers the issue's list: slices with whole cards, TDM capacity and MIG placements with counters; TDM claims of
30 %/2Gi and 50 %/8Gi getting exactly those quotas; a MIG claim getting its instance at the allocated placement;
unprepare reclaiming; a fatal XID tainting the card (through the fault stream: the driver's poll is an hour here)
and resolving it untainting; kill -9 of the driver between prepare and unprepare losing and leaking nothing;
concurrent prepares; a daemon restart; the ``unmonitored`` taint while the daemon is away."""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from healthd.api.v1 import partitions_pb2 as ppb
from tests.kubernetes.stack import cdi_names
from tests.support import dra_allocations as alloc
from tests.support.dra_stack import DRIVER, NODE, DraStack, dra_stack
from tests.support.kubelet_dra import Claim, Plugin, PrepareError
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

GIB = 1 << 30
POD = ("trainer", "0f0e0d0c-0000-4000-8000-000000000001")
MODES = {"1": ppb.PARTITION_MODE_TDM, "2": ppb.PARTITION_MODE_TDM, "6": ppb.PARTITION_MODE_MIG}
FAST = "refresh_seconds = 0.5\n"


def add_claim(stack: DraStack, claim: dict[str, Any]) -> Claim:
    made = stack.api.add("resourceclaims", claim, namespace=claim["metadata"]["namespace"])
    meta = made["metadata"]
    return Claim(meta["namespace"], meta["uid"], meta["name"])


def ready(stack: DraStack, *devices: str) -> None:
    wait_until(stack.register, "the driver registers with kubelet", 30)
    wait_until(lambda: set(devices) <= set(stack.devices()), f"published: {devices}", 30)


def claim_partitions(stack: DraStack) -> dict[str, Any]:
    """Partitions owned by a claim, by claim uid (one each in these tests)."""
    return {p.owner.claim.uid: p for p in stack.partitions() if p.owner.WhichOneof("kind") == "claim"}


def follow(stack: DraStack, into: list[Any]) -> None:
    """The health stream, each message appended, until the stream ends (the driver stops, the test is over)."""
    with contextlib.suppress(grpc.RpcError):
        for message in stack.kubelet.watch_health(DRIVER, timeout=60):
            into.append(message)  # noqa: PERF402 - a live stream: the test reads the list while it grows


def test_slices_and_claims_from_prepare_to_unprepare(tmp_path: Path) -> None:
    with dra_stack(tmp_path, driver_config=FAST, modes=MODES) as stack:
        ready(stack, "gpu-0", "gpu-1-tdm", "gpu-2-tdm", "gpu-6-mig-1g-18gb-3", "gpu-6-mig-7g-141gb-0")
        devices = stack.devices()
        assert stack.api.rejected == []  # every write passed both strict schemas
        slices = stack.api.items("resourceslices")
        counters = [s for s in slices if s["spec"].get("sharedCounters")]
        (mig_set,) = counters[0]["spec"]["sharedCounters"]
        assert set(mig_set["counters"]) >= {f"memory-slice-{i}" for i in range(8)} | {"compute-slices"}
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
        whole = devices["gpu-0"]["attributes"]
        assert whole["driverVersion"] == {"version": "580.159.4"} and whole["architecture"] == {"string": "Hopper"}
        assert whole["resource.kubernetes.io/pcieRoot"]["string"].startswith("pci")
        assert whole["nvlinkDomain"] == {"string": "nvswitch"}
        tdm = devices["gpu-1-tdm"]
        assert tdm["allowMultipleAllocations"] is True
        assert tdm["capacity"]["compute"]["requestPolicy"]["validRange"] == {"min": "1", "max": "100", "step": "1"}
        # gpu 7 has MIG on in hardware but mode none: neither a whole card nor MIG devices
        assert not [name for name in devices if name.startswith("gpu-7")]

        a = add_claim(stack, alloc.tdm_share("a", "ml", NODE, "gpu-1-tdm", POD, compute="30", memory="2Gi"))
        b = add_claim(stack, alloc.tdm_share("b", "ml", NODE, "gpu-2-tdm", POD, compute="50", memory="8Gi"))
        m = add_claim(stack, alloc.mig_partition("m", "ml", NODE, "gpu-6-mig-1g-18gb-3", POD))
        w = add_claim(stack, alloc.whole_card("w", "ml", NODE, "gpu-0", POD))
        prepared = stack.kubelet.prepare(DRIVER, [a, b, m, w])

        owned = claim_partitions(stack)
        assert set(owned) == {a.uid, b.uid, m.uid}  # the whole card needs no partition
        assert (owned[a.uid].gpu, owned[a.uid].compute_percent, owned[a.uid].memory_limit_bytes) == (1, 30, 2 * GIB)
        assert (owned[b.uid].gpu, owned[b.uid].compute_percent, owned[b.uid].memory_limit_bytes) == (2, 50, 8 * GIB)
        assert (owned[m.uid].gpu, owned[m.uid].mig.profile, owned[m.uid].mig.placement_start) == (6, "1g.18gb", 3)
        for claim in (a, b, m):
            (device,) = prepared[claim.uid]
            assert list(device.cdi_device_ids) == [owned[claim.uid].cdi_device]
        (card,) = prepared[w.uid]
        assert list(card.cdi_device_ids) == [f"xpu-runtime-kit.io/gpu={whole['uuid']['string']}"]
        assert prepared[a.uid][0].share_id  # v1 carries the allocation's share id back
        named = {c for devs in prepared.values() for d in devs for c in d.cdi_device_ids}
        assert named <= cdi_names(stack.daemon)

        # kubelet retries (e.g. after its own restart): the same answers, no second partition
        again = stack.kubelet.prepare(DRIVER, [a, b, m, w])
        assert {u: [list(d.cdi_device_ids) for d in ds] for u, ds in again.items()} == {
            u: [list(d.cdi_device_ids) for d in ds] for u, ds in prepared.items()
        }
        assert len(stack.partitions()) == 3

        stack.kubelet.unprepare(DRIVER, [a, b, m, w])
        assert claim_partitions(stack) == {}
        assert not named - {c for c in named if c.endswith(whole["uuid"]["string"])} & cdi_names(stack.daemon)
        assert stack.driver.checkpoint["claims"] == {}
        stack.kubelet.unprepare(DRIVER, [a])  # idempotent


def test_a_claim_for_another_node_or_a_recreated_claim_fails_that_claim_only(tmp_path: Path) -> None:
    with dra_stack(tmp_path, driver_config=FAST, modes=MODES) as stack:
        ready(stack, "gpu-1-tdm")
        elsewhere = add_claim(stack, alloc.whole_card("x", "ml", "node-b", "gpu-0", POD))
        stale = Claim("ml", "00000000-dead-4000-8000-000000000000", "x")
        with pytest.raises(PrepareError, match=r"no allocation of gpu\.xpu-runtime-kit\.io on this node"):
            stack.kubelet.prepare(DRIVER, [elsewhere])
        with pytest.raises(PrepareError, match="re-created"):
            stack.kubelet.prepare(DRIVER, [stale])
        too_much = add_claim(stack, alloc.tdm_share("t", "ml", NODE, "gpu-1-tdm", POD, compute="100", memory="1Gi"))
        fine = add_claim(stack, alloc.tdm_share("f", "ml", NODE, "gpu-2-tdm", POD, compute="10", memory="1Gi"))
        stack.kubelet.prepare(DRIVER, [too_much])
        with pytest.raises(PrepareError, match="RESOURCE_EXHAUSTED"):
            stack.kubelet.prepare(DRIVER, [add_claim(stack, alloc.tdm_share(
                "u", "ml", NODE, "gpu-1-tdm", POD, compute="5", memory="1Gi"))])  # fmt: skip
        assert stack.kubelet.prepare(DRIVER, [fine])[fine.uid]


def test_fault_taints_the_card_from_the_stream_and_resolving_removes_it(tmp_path: Path) -> None:
    config = "refresh_seconds = 3600\n"  # no poll: only the fault stream can bring the taint
    with dra_stack(tmp_path, driver_config=config) as stack:
        ready(stack, "gpu-3")
        health: list[Any] = []
        reader = threading.Thread(target=follow, args=(stack, health), daemon=True)
        reader.start()
        wait_until(lambda: health, "the first health message")
        assert {d.device.device_name: d.health for d in health[0].devices}["gpu-3"] == 1  # HEALTHY
        injected = stack.daemon.xpuctl("simulate", "inject", "xid", "--gpu", "3", "code=79")
        assert injected.returncode == 0, injected.stderr
        taint = wait_until(lambda: stack.devices()["gpu-3"].get("taints"), "gpu-3 tainted", 20)
        assert [(t["key"], t["effect"]) for t in taint] == [("xpu-runtime-kit.io/fault", "NoSchedule")]
        assert taint[0]["value"].startswith("xid")
        assert not stack.devices()["gpu-2"].get("taints")
        wait_until(
            lambda: {d.device.device_name: d.health for d in health[-1].devices}["gpu-3"] == 2, "gpu-3 UNHEALTHY"
        )
        listed = stack.daemon.xpuctl("faults", "list", "--state", "active", "--gpu", "3", "--json")
        (fault_id,) = [f["id"] for f in json.loads(listed.stdout)["faults"]]
        resolved = stack.daemon.xpuctl("faults", "resolve", fault_id, "--reason", "reseated")
        assert resolved.returncode == 0, resolved.stderr
        wait_until(lambda: not stack.devices()["gpu-3"].get("taints"), "gpu-3 untainted", 20)
        wait_until(lambda: {d.device.device_name: d.health for d in health[-1].devices}["gpu-3"] == 1, "healthy")
        assert stack.api.rejected == []


def test_noexecute_is_configurable(tmp_path: Path) -> None:
    with dra_stack(tmp_path, driver_config=FAST + 'fault_taint_effect = "NoExecute"\n') as stack:
        ready(stack, "gpu-4")
        assert stack.daemon.xpuctl("simulate", "inject", "xid", "--gpu", "4", "code=79").returncode == 0
        taint = wait_until(lambda: stack.devices()["gpu-4"].get("taints"), "gpu-4 tainted", 20)
        assert taint[0]["effect"] == "NoExecute" and taint[0]["timeAdded"]


def new_instance(stack: DraStack, crashed: Plugin) -> bool:
    """True once kubelet has registered a plugin instance other than ``crashed`` (its socket was re-created)."""
    stack.kubelet.register()
    plugin = stack.kubelet.plugins.get(DRIVER)
    return plugin is not None and plugin.stamp != crashed.stamp


def test_kill9_between_prepare_and_unprepare_loses_and_leaks_nothing(tmp_path: Path) -> None:
    with dra_stack(tmp_path, driver_config=FAST, modes=MODES) as stack:
        ready(stack, "gpu-1-tdm", "gpu-6-mig-3g-71gb-4")
        kept = add_claim(stack, alloc.tdm_share("k", "ml", NODE, "gpu-1-tdm", POD, compute="30", memory="2Gi"))
        mig = add_claim(stack, alloc.mig_partition("g", "ml", NODE, "gpu-6-mig-3g-71gb-4", POD))
        deleted = add_claim(stack, alloc.tdm_share("d", "ml", NODE, "gpu-2-tdm", POD, compute="20", memory="1Gi"))
        before = stack.kubelet.prepare(DRIVER, [kept, mig, deleted])
        partitions = {p.id for p in stack.partitions()}
        assert len(partitions) == 3

        crashed = stack.kubelet.plugins[DRIVER]
        stack.driver.kill9()
        stack.api.delete("resourceclaims", "d", namespace="ml")  # the claim goes while the driver is down
        stack.driver.start()
        # kill -9 leaves the registration socket behind, so kubelet keeps the crashed instance until the new one
        # replaces that socket; only then does it dial the new endpoint (calls before that fail UNAVAILABLE)
        wait_until(lambda: new_instance(stack, crashed), "the restarted driver re-registered", 30)
        wait_until(lambda: len(stack.partitions()) == 2, "the deleted claim's partition reclaimed on start", 30)
        assert {p.id for p in stack.partitions()} < partitions  # the others kept: the same partitions
        after = stack.kubelet.prepare(DRIVER, [kept, mig])
        for claim in (kept, mig):
            assert [list(d.cdi_device_ids) for d in after[claim.uid]] == [
                list(d.cdi_device_ids) for d in before[claim.uid]
            ]
        stack.kubelet.unprepare(DRIVER, [kept, mig])
        assert stack.partitions() == []


def test_concurrent_prepares_on_one_card(tmp_path: Path) -> None:
    with dra_stack(tmp_path, driver_config=FAST, modes=MODES) as stack:
        ready(stack, "gpu-1-tdm")
        claims = [
            add_claim(stack, alloc.tdm_share(f"c{i}", "ml", NODE, "gpu-1-tdm", POD, compute="10", memory="4Gi"))
            for i in range(8)
        ]
        with ThreadPoolExecutor(5) as pool:  # four one-claim calls and one call with four claims, at once
            calls = [pool.submit(stack.kubelet.prepare, DRIVER, [c]) for c in claims[:4]]
            calls.append(pool.submit(stack.kubelet.prepare, DRIVER, claims[4:]))
            results = [c.result() for c in calls]
        assert sum(len(r) for r in results) == 8
        owned = claim_partitions(stack)
        assert set(owned) == {c.uid for c in claims}
        assert len({p.id for p in owned.values()}) == 8
        assert sum(p.compute_percent for p in owned.values()) == 80
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda c: stack.kubelet.unprepare(DRIVER, [c]), claims))
        assert stack.partitions() == []


def test_daemon_restart_and_the_unmonitored_taint(tmp_path: Path) -> None:
    config = FAST + "unmonitored_grace_seconds = 1.0\ncall_timeout_seconds = 2.0\n"
    with dra_stack(tmp_path, driver_config=config, modes=MODES) as stack:
        ready(stack, "gpu-1-tdm")
        first = add_claim(stack, alloc.tdm_share("r1", "ml", NODE, "gpu-1-tdm", POD, compute="30", memory="2Gi"))
        stack.kubelet.prepare(DRIVER, [first])
        stack.daemon.stop()
        wait_until(
            lambda: all(
                any(t["value"] == "unmonitored" for t in d.get("taints") or ()) for d in stack.devices().values()
            ),
            "every device tainted unmonitored",
            30,
        )
        stack.daemon.start()
        wait_until(lambda: not any(d.get("taints") for d in stack.devices().values()), "taints gone", 30)
        second = add_claim(stack, alloc.tdm_share("r2", "ml", NODE, "gpu-1-tdm", POD, compute="20", memory="2Gi"))
        stack.kubelet.prepare(DRIVER, [second])
        assert {p.compute_percent for p in claim_partitions(stack).values()} == {30, 20}
        stack.kubelet.unprepare(DRIVER, [first, second])
        assert claim_partitions(stack) == {}
        assert stack.api.rejected == []


def test_an_older_kubelet_on_v1beta1_and_health_v1alpha1(tmp_path: Path) -> None:
    """kubelet 1.32/1.33 speak DRA v1beta1 only, 1.34-1.36 health v1alpha1 only: the same driver serves both."""
    with dra_stack(tmp_path, driver_config=FAST, modes=MODES) as stack:
        ready(stack, "gpu-1-tdm")
        plugin = stack.kubelet.plugins[DRIVER]
        assert (plugin.service, plugin.health) == ("v1.DRAPlugin", "v1.DRAResourceHealth")  # what 1.37 picks
        plugin.service, plugin.health = "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"
        share = add_claim(stack, alloc.tdm_share("old", "ml", NODE, "gpu-1-tdm", POD, compute="25", memory="1Gi"))
        (device,) = stack.kubelet.prepare(DRIVER, [share])[share.uid]
        assert not hasattr(device, "share_id")  # v1beta1's Device has none
        assert list(device.cdi_device_ids) == [claim_partitions(stack)[share.uid].cdi_device]
        health: list[Any] = []
        threading.Thread(target=follow, args=(stack, health), daemon=True).start()
        first = wait_until(lambda: health and health[0], "a v1alpha1 health message")
        assert type(first).__module__.endswith("v1alpha1.api_pb2")
        assert {d.device.device_name for d in first.devices} >= {"gpu-0", "gpu-1-tdm"}
        stack.kubelet.unprepare(DRIVER, [share])
        assert claim_partitions(stack) == {}
