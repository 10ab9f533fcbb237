"""The driver's pieces without processes: the command line and config file, the checkpoint's crash safety, request
ids, the taint rule and node facts of the publisher, and registration's answer to GetInfo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from container.core.inventory import NodeView
from container.dra.checkpoint import PREPARED, Checkpoint, ClaimEntry, PreparedDevice
from container.dra.config import DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRY_DIR, ConfigError, build_parser, load
from container.dra.prepare import MAX_REQUEST_ID, request_id
from container.dra.publisher import busy_placements, node_facts
from container.dra.registration import SUPPORTED_VERSIONS
from healthd.api.v1 import partitions_pb2 as ppb
from tests.support.paths import REPO

REQUIRED = ["--healthd-socket", "unix:/run/x/healthd.sock", "--node-name", "node-a"]


def test_the_command_line_and_its_defaults() -> None:
    config = load(build_parser().parse_args(REQUIRED))
    assert config.registry_dir == DEFAULT_REGISTRY_DIR == Path("/var/lib/kubelet/plugins_registry")
    assert config.plugin_dir == DEFAULT_PLUGIN_DIR == Path("/var/lib/kubelet/plugins/gpu.xpu-runtime-kit.io")
    assert config.plugin_socket == config.plugin_dir / "dra.sock"
    assert config.checkpoint_file.parent == config.plugin_dir
    assert config.kubeconfig is None  # in-cluster credentials
    assert config.admin_address == "unix:/run/x/healthd-admin.sock"
    assert config.fault_taint_effect == "NoSchedule"


@pytest.mark.parametrize(
    ("extra", "config_text", "message"),
    [
        (["--admin-socket", "/run/x/a.sock"], None, "--admin-socket: expected unix:PATH"),
        ([], 'fault_taint_effect = "Evict"\n', "fault_taint_effect must be one of NoSchedule, NoExecute"),
        ([], "refresh_seconds = 0\n", "refresh_seconds must be above 0"),
        ([], "refresh_secs = 1\n", "unknown key 'refresh_secs'"),
        ([], "unmonitored_grace_seconds = true\n", "must be a float"),
        ([], "refresh_seconds = [\n", "--config"),
    ],
)
def test_bad_options_name_themselves(tmp_path: Path, extra: list[str], config_text: str | None, message: str) -> None:
    args = [*REQUIRED, *extra]
    if config_text is not None:
        (tmp_path / "c.toml").write_text(config_text)
        args += ["--config", str(tmp_path / "c.toml")]
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load(build_parser().parse_args(args))


def test_a_bad_kubeconfig_is_exit_status_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "container.dra", *REQUIRED, "--kubeconfig", str(tmp_path / "kubeconfig")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"xpu-dra-driver: --kubeconfig {tmp_path / 'kubeconfig'}: ")
    assert len(result.stderr.strip().splitlines()) == 1


def entry(n: int) -> ClaimEntry:
    device = PreparedDevice(("tdm",), "node-a", "gpu-1-tdm", (f"xpu-runtime-kit.io/gpu=p-{n:012x}",), "s", f"p-{n}")
    return ClaimEntry("ml", f"claim-{n}", PREPARED, (device,))


def test_the_checkpoint_survives_a_restart_and_a_crash_mid_write(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path)
    first.load()
    first.put("uid-1", entry(1))
    first.put("uid-2", entry(2))
    first.drop("uid-1")
    again = Checkpoint(path)
    again.load()
    assert again.claims == {"uid-2": entry(2)}
    # a crash after writing the temporary file but before the rename: the old file is what counts
    (tmp_path / ".checkpoint.json.tmp").write_text('{"version": 1, "claims": {"half')
    after_crash = Checkpoint(path)
    after_crash.load()
    assert after_crash.claims == {"uid-2": entry(2)}


def test_an_unreadable_checkpoint_is_set_aside_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 1, "claims": {"u": {"namespace": "ml", "name": "c", "state": "odd"}}}))
    checkpoint = Checkpoint(path)
    checkpoint.load()
    assert checkpoint.claims == {}
    assert (tmp_path / "checkpoint.json.corrupt").exists() and not path.exists()


@given(
    uid=st.uuids().map(str),
    device=st.from_regex(r"gpu-[0-9]{1,2}-mig-[a-z0-9-]{1,40}-[0-9]", fullmatch=True),
    share=st.one_of(st.just(""), st.uuids().map(str)),
)
def test_request_ids_fit_the_daemon_and_differ_per_device_and_share(uid: str, device: str, share: str) -> None:
    rid = request_id(uid, device, share)
    assert len(rid) <= MAX_REQUEST_ID and rid.startswith(uid + "/")
    assert rid != request_id(uid, device + "x", share)
    assert rid != request_id(uid, device, share + "1")
    assert rid == request_id(uid, device, share)


def test_registration_offers_v1_first_and_both_health_services() -> None:
    assert SUPPORTED_VERSIONS[0] == "v1.DRAPlugin"
    assert "v1beta1.DRAPlugin" in SUPPORTED_VERSIONS
    assert {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} <= set(SUPPORTED_VERSIONS)


def test_node_facts_and_foreign_placements_from_the_daemons_replies() -> None:
    ranges = [ppb.MigPlacementRange(start=0, size=4), ppb.MigPlacementRange(start=4, size=4)]
    profile = ppb.MigProfileRoom(profile="3g.71gb", profile_id=9, placements=ranges)
    cards = (
        ppb.CardCapacity(gpu=0, driver_version="580.159.04", architecture="Hopper"),
        ppb.CardCapacity(gpu=6, mode=ppb.PARTITION_MODE_MIG, mig_memory_slices=8, mig_profiles=[profile]),
    )
    mine = ppb.Partition(gpu=6, owner=ppb.Owner(claim=ppb.ClaimOwner(uid="u")), mig=ppb.MigDevice(placement_start=0))
    theirs = ppb.Partition(
        gpu=6, owner=ppb.Owner(lease=ppb.LeaseOwner(holder="x")), mig=ppb.MigDevice(placement_start=4, placement_size=4)
    )
    view = NodeView(capacity=cards, partitions=(mine, theirs))
    facts = node_facts(view)
    assert (facts.driver_version, facts.architecture, facts.mig_memory_slices) == ("580.159.04", "Hopper", 8)
    assert facts.mig_placements == {9: ((0, 4), (4, 4))}
    assert busy_placements(view) == {6: [(4, 4)]}  # a claim's own instance stays offered: it is allocated
