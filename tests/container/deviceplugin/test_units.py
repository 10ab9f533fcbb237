"""xpu-device-plugin without processes: its import boundary, configuration, the fault rule and the slot arithmetic."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from container.core.faults import FaultTracker, takes_out_of_service
from container.core.inventory import Card, NodeView, ProfileRoom
from container.deviceplugin.config import ConfigError, PluginConfig, build_parser, load, parse_file
from container.deviceplugin.resources import Context, Slices, WholeCards
from container.deviceplugin.runtime_answer import RuntimeAnswer
from container.deviceplugin.server import Changes
from healthd.api.v1 import health_pb2 as hpb
from healthd.api.v1 import partitions_pb2 as ppb
from tests.support.paths import REPO

STDLIB = set(sys.stdlib_module_names)
THIRD_PARTY = {"grpc", "google", "structlog"}


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_plugin_imports_only_the_daemons_generated_api() -> None:
    """The seed's boundary: the plugin talks to the daemon over gRPC and imports none of its internals."""
    layer = REPO / "container"  # the DRA driver (dra/) has its own third-party client
    files = [p for p in layer.rglob("*.py") if not {"api", "dra"} & set(p.relative_to(layer).parts)]
    assert len(files) >= 8
    bad = []
    for path in files:
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in STDLIB or top in THIRD_PARTY or top == "container" or top == "__future__":
                continue
            parts = name.split(".")
            if parts[:3] == ["healthd", "api", "v1"] and len(parts) == 4 and parts[3].endswith(("_pb2", "_pb2_grpc")):
                continue
            bad.append(f"{path.relative_to(REPO)}: {name}")
    assert bad == []


def test_running_the_plugin_loads_no_daemon_module() -> None:
    code = (
        "import sys, container.deviceplugin.main, container.deviceplugin.plugin\n"
        "bad = sorted(m for m in sys.modules if (m.startswith('healthd.') and not m.startswith('healthd.api'))"
        " or m.startswith('exporter') or m == 'pynvml')\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
    assert imports_of(REPO / "healthd" / "__init__.py") == []  # the parent package loads nothing either


def args(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_config_defaults_and_file(tmp_path: Path) -> None:
    config = load(args("--healthd-socket", "unix:/run/x/healthd.sock"))
    assert config.admin_address == "unix:/run/x/healthd-admin.sock"
    assert config.kubelet_dir == Path("/var/lib/kubelet/device-plugins")
    toml = tmp_path / "p.toml"
    toml.write_text(
        'domain = "example.com"\nwhole_cards = false\n[mig]\nprofiles = ["3g.71gb"]\n'
        '[tdm]\nshapes = [{compute_percent = 10, memory = "1536MiB"}, {compute_percent = 50, memory = "64GiB"}]\n'
        "[partitions]\nlease_seconds = 30\n"
    )
    config = load(args("--config", str(toml)))
    assert (config.domain, config.whole_cards, config.mig_profiles) == ("example.com", False, ("3g.71gb",))
    assert [s.suffix for s in config.tdm_shapes] == ["tdm-10c.1536mib", "tdm-50c.64gib"]
    assert config.lease_seconds == 30


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1", "config.bogus: unknown option"),
        ('domain = "Not A Domain"', "domain:"),
        ('[tdm]\nshapes = [{compute_percent = 0, memory = "1GiB"}]', "tdm.shapes[0].compute_percent"),
        ('[tdm]\nshapes = [{compute_percent = 10, memory = "100MiB"}]', "multiple of 128 MiB"),
        ('[tdm]\nshapes = [{compute_percent = 10, memory = "1GB"}]', "tdm.shapes[0].memory"),
        (
            '[tdm]\nshapes = [{compute_percent = 10, memory = "1GiB"}, {compute_percent = 10, memory = "1024MiB"}]',
            "twice",
        ),
        ("[partitions]\nlease_seconds = 1", "partitions.lease_seconds"),
        ("[mig]\nprofiles = [1]", "mig.profiles"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_config_errors_name_the_option(tmp_path: Path, text: str, message: str) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(args("--config", str(toml)))
    assert message in str(err.value)


def test_bad_flags_and_missing_file_exit_with_a_message(tmp_path: Path) -> None:
    for argv, message in [
        (["--healthd-socket", "/run/healthd.sock"], "--healthd-socket: expected unix:/absolute/path"),
        (["--config", str(tmp_path / "missing.toml")], "No such file"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "container.deviceplugin", *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        assert out.returncode == 2 and message in out.stderr


def fault(gpu: int | None, action: int, code: str = "xid_79", state: int = 1, fid: str = "f1") -> Any:
    f = hpb.Fault(id=fid, code=code, action=action, state=state)
    if gpu is not None:
        f.gpu.CopyFrom(hpb.GpuRef(index=gpu))
    return f


def test_fault_rule_and_tracker() -> None:
    assert takes_out_of_service(fault(1, hpb.ACTION_RESET_GPU))
    assert takes_out_of_service(fault(1, hpb.ACTION_NONE, code="driver_call_timeout"))
    assert not takes_out_of_service(fault(1, hpb.ACTION_RESTART_APP))
    assert not takes_out_of_service(fault(1, hpb.ACTION_REPLACE_NODE, state=hpb.FAULT_STATE_RESOLVED))
    changes: list[int] = []
    tracker = FaultTracker(None, lambda: changes.append(1))  # type: ignore[arg-type]
    assert tracker.apply(fault(2, hpb.ACTION_REPLACE_NODE, fid="a"))
    assert not tracker.apply(fault(2, hpb.ACTION_REPLACE_NODE, fid="a"))  # a replayed record changes nothing
    assert tracker.apply(fault(4, hpb.ACTION_NONE, code="gpu_lost", fid="b"))
    assert tracker.out_of_service(8) == {2, 4}
    assert tracker.apply(fault(2, hpb.ACTION_REPLACE_NODE, state=hpb.FAULT_STATE_RESOLVED, fid="a"))
    assert tracker.out_of_service(8) == {4}
    assert tracker.apply(fault(None, hpb.ACTION_REBOOT_NODE, fid="n"))  # node-wide: every card
    assert tracker.out_of_service(8) == frozenset(range(8))
    assert tracker.reasons(3) == ["xid_79 (n)"]


def card(index: int, mode: int, **kw: Any) -> Card:
    base = {
        "uuid": f"GPU-{index}",
        "numa_node": index // 4,
        "mode": mode,
        "hardware_mig": mode == ppb.PARTITION_MODE_MIG,
        "memory_total_mib": 143_771,
        "compute_allocated": 0,
        "memory_allocated_mib": 0,
    }
    base.update(kw)
    return Card(index=index, **base)


def context(view: NodeView, out: frozenset[int] = frozenset()) -> Context:
    async def changed() -> None:
        return None

    async def read_now(within: float) -> NodeView:
        return view

    return Context(
        None,  # type: ignore[arg-type]
        "xpu-runtime-kit.io",
        60,
        lambda: view,
        lambda: out,
        changed,
        unmonitored=lambda: None,
        read_now=read_now,
        answer=RuntimeAnswer("cdi", Path("/nonexistent")),
    )


def test_slot_health_follows_the_room_on_the_card() -> None:
    profiles = {
        "1g.18gb": ProfileRoom("1g.18gb", 16384, 16, 7, 5),
        "7g.141gb": ProfileRoom("7g.141gb", 143360, 132, 1, 0),
    }
    used = ppb.Partition(id="p-1")
    view = NodeView(
        cards=(
            card(0, ppb.PARTITION_MODE_NONE),
            card(6, ppb.PARTITION_MODE_MIG, profiles=profiles),
            card(3, ppb.PARTITION_MODE_TDM, compute_allocated=60),
        ),
        by_device={("xpu-runtime-kit.io/mig-1g.18gb", "GPU-6::4"): used},
    )
    mig = Slices(context(view), profile="1g.18gb")
    health = {d.ID: d.health for d in mig.devices()}
    assert list(health) == [f"GPU-6::{n}" for n in range(7)]
    # slot 4 is in use (healthy); five more fit, so the first five free slots are healthy and the last one is not
    assert [health[f"GPU-6::{n}"] for n in range(7)] == ["Healthy"] * 6 + ["Unhealthy"]
    assert all(d.health == "Unhealthy" for d in Slices(context(view), profile="7g.141gb").devices())
    assert all(d.health == "Unhealthy" for d in Slices(context(view, frozenset({6})), profile="1g.18gb").devices())
    from container.deviceplugin.config import TdmShape

    tdm = Slices(context(view), shape=TdmShape(25, 32768))
    assert [d.health for d in tdm.devices()] == ["Healthy"] * 1 + ["Unhealthy"] * 3  # 40 % left: one 25 % slice
    whole = WholeCards(context(view, frozenset({0})))
    assert [(d.ID, d.health, d.topology.nodes[0].ID) for d in whole.devices()] == [("GPU-0", "Unhealthy", 0)]
    # the MIG amounts asked of the daemon pick exactly this profile (its own SM share and memory)
    assert mig._amounts(view.cards[1]) == (12, "16384MiB")


def test_preferred_slices_pack_the_fullest_card_first() -> None:
    profiles = {"1g.18gb": ProfileRoom("1g.18gb", 16384, 16, 7, 7)}
    busy = {"1g.18gb": ProfileRoom("1g.18gb", 16384, 16, 7, 2)}
    view = NodeView(
        cards=(card(6, ppb.PARTITION_MODE_MIG, profiles=profiles), card(7, ppb.PARTITION_MODE_MIG, profiles=busy))
    )
    mig = Slices(context(view), profile="1g.18gb")
    available = [d.ID for d in mig.devices() if d.health == "Healthy"]
    assert asyncio.run(mig.preferred(available, [], 1)) == ["GPU-7::0"]


def test_changes_wake_every_waiter() -> None:
    async def go() -> int:
        changes = Changes()
        woken = 0

        async def waiter() -> None:
            nonlocal woken
            await changes.wait_beyond(0)
            woken += 1

        tasks = [asyncio.create_task(waiter()) for _ in range(3)]
        await asyncio.sleep(0)
        changes.bump()
        await asyncio.gather(*tasks)
        return woken

    assert asyncio.run(go()) == 3


def test_default_config_is_valid() -> None:
    assert parse_file({}, PluginConfig()) == PluginConfig()


def test_allocate_refuses_slots_that_do_not_exist_now() -> None:
    from container.deviceplugin.resources import AllocationError

    profiles = {"1g.18gb": ProfileRoom("1g.18gb", 16384, 16, 7, 7)}
    view = NodeView(cards=(card(6, ppb.PARTITION_MODE_MIG, profiles=profiles), card(0, ppb.PARTITION_MODE_NONE)))
    mig = Slices(context(view), profile="1g.18gb")
    for ids in (["GPU-6::7"], ["GPU-6::x"], ["GPU-0::0"], ["GPU-9::0"], ["GPU-6"]):
        with pytest.raises(AllocationError) as err:
            asyncio.run(mig.allocate(ids))
        assert err.value.code.name == "NOT_FOUND", ids
    with pytest.raises(AllocationError) as err:
        asyncio.run(mig.allocate(["GPU-6::0", "GPU-6::1"]))
    assert err.value.code.name == "INVALID_ARGUMENT"
