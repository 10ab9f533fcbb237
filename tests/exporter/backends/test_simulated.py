"""The simulated node: moving values, fault injection and its validation, MIG rules, scenario files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.backends.errors import GpuLostError, InsufficientResourcesError, InUseError, VersionMismatchError
from exporter.backends.scenario import ScenarioError, load_scenario
from exporter.backends.simulated import FAULT_PARAMS, SimulatedBackend
from exporter.backends.types import UNKNOWN, UNSUPPORTED, EventKind, LinkState
from tests.support.clock import FakeClock


def test_values_move_over_time(sim: SimulatedBackend, clock: FakeClock) -> None:
    a = sim.sample(0)
    clock.advance(30)
    b = sim.sample(0)
    assert b.energy_joules > a.energy_joules  # type: ignore[operator]
    assert a.gpu_utilization_ratio != b.gpu_utilization_ratio


def test_h200x1_replays_the_capture(clock: FakeClock) -> None:
    sim = SimulatedBackend.from_name("h200x1", clock=clock)
    sim.open()
    s = sim.sample(0)
    info = sim.device_info(0)
    assert info.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert info.memory_total_bytes == 150754820096
    assert s.nvlinks is UNSUPPORTED
    assert s.gpu_utilization_ratio == 0.0
    assert s.power_draw_watts == pytest.approx(78.7)


def test_xid_and_ecc_events(sim: SimulatedBackend) -> None:
    assert sim.wait_event(0.01) is None
    sim.inject("xid", 2, {"code": "79"})
    sim.inject("ecc", 1, {"uncorrected": "2"})
    first, second = sim.wait_event(1), sim.wait_event(1)
    assert first is not None and (first.kind, first.gpu_index, first.xid) == (EventKind.XID, 2, 79)
    assert second is not None and (second.kind, second.xid, second.data) == (EventKind.ECC_DOUBLE_BIT, 48, 2)
    assert sim.sample(1).ecc.uncorrected_volatile == 2


def test_gpu_lost_fails_calls_like_nvml(sim: SimulatedBackend) -> None:
    sim.inject("gpu_lost", 4)
    with pytest.raises(GpuLostError):
        sim.sample(4)
    sim.sample(3)
    sim.clear(4)
    sim.sample(4)


def test_nvlink_down_and_errors(sim: SimulatedBackend) -> None:
    sim.inject("nvlink_down", 0, {"link": "17"})
    sim.inject("nvlink_errors", 0, {"link": "3", "crc": "10", "replay": "2"})
    links = sim.sample(0).nvlinks
    assert links is not UNSUPPORTED
    assert links[17].state is LinkState.DOWN  # type: ignore[index]
    assert (links[3].crc_errors, links[3].replay_errors) == (10, 2)  # type: ignore[index]


def test_processes_come_and_go(sim: SimulatedBackend) -> None:
    sim.inject("process_start", 6, {"pid": "777", "memory_mib": "2048", "name": "train"})
    procs = {p.pid: p for p in sim.processes(6)}
    assert procs[777].used_memory_bytes == 2048 * 2**20 and procs[777].name == "train"
    assert sim.sample(6).memory_used_bytes >= 2048 * 2**20
    sim.inject("process_exit", 6, {"pid": "777"})
    assert 777 not in {p.pid for p in sim.processes(6)}


def test_orphan_memory_is_used_but_owned_by_nobody(sim: SimulatedBackend) -> None:
    before = sim.sample(6).memory_used_bytes
    sim.inject("orphan_memory", 6, {"memory_mib": "4096"})
    assert sim.sample(6).memory_used_bytes == before + 4096 * 2**20
    assert sum(p.used_memory_bytes for p in sim.processes(6)) == 0  # type: ignore[misc]


def test_version_mismatch_at_start(clock: FakeClock) -> None:
    sim = SimulatedBackend(load_scenario("h200x1"), clock=clock, version_mismatch=True)
    with pytest.raises(VersionMismatchError):
        sim.open()


def test_mig_placement_follows_the_h200_rules(sim: SimulatedBackend) -> None:
    # GPU 6: MIG on and empty. 3g.71gb fits at 0 and 4; a third one does not.
    a = sim.create_mig_instance(6, 9, 0)
    c = sim.create_mig_instance(6, 9, 4)
    with pytest.raises(InsufficientResourcesError):
        sim.create_mig_instance(6, 9, 0)
    with pytest.raises(InsufficientResourcesError):
        sim.create_mig_instance(6, 19, 2)  # slice taken
    sim.destroy_mig_instance(6, a.gpu_instance_id)
    with pytest.raises(InsufficientResourcesError):
        sim.create_mig_instance(6, 14, 1)  # 2g.35gb may start only at 0, 2 or 4
    b = sim.create_mig_instance(6, 14, 2)
    assert b.uuid.startswith("MIG-") and b.memory_total_bytes == 33280 * 2**20
    layout = sorted((i.placement_start, i.placement_size, i.profile_name) for i in sim.mig_instances(6))
    assert layout == [(2, 2, "2g.35gb"), (4, 4, "3g.71gb")]
    assert {i.gpu_instance_id for i in sim.mig_instances(6)} == {b.gpu_instance_id, c.gpu_instance_id}


def test_mig_destroy_in_use_is_refused(sim: SimulatedBackend) -> None:
    with pytest.raises(InUseError):
        sim.destroy_mig_instance(7, 1)  # the jupyter kernel runs in GPU instance 1
    sim.inject("process_exit", 7, {"pid": "63001"})
    sim.destroy_mig_instance(7, 1)


def test_bad_fault_requests_are_clear_errors(sim: SimulatedBackend) -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        sim.inject("meltdown", 0)
    with pytest.raises(ValueError, match="does not take"):
        sim.inject("xid", 0, {"code": "79", "colour": "red"})
    with pytest.raises(ValueError, match="missing parameter 'code'"):
        sim.inject("xid", 0)
    with pytest.raises(ValueError, match="link 18 does not exist"):
        sim.inject("nvlink_down", 0, {"link": "18"})


@settings(max_examples=300, deadline=None)
@given(
    kind=st.one_of(st.sampled_from(sorted(FAULT_PARAMS)), st.text(max_size=12)),
    gpu=st.integers(min_value=-3, max_value=12),
    params=st.dictionaries(
        st.one_of(st.sampled_from(sorted({p for ps in FAULT_PARAMS.values() for p in ps})), st.text(max_size=6)),
        st.one_of(st.integers(-5, 10**6).map(str), st.text(max_size=8)),
        max_size=4,
    ),
)
def test_any_fault_request_either_applies_or_raises_value_error(kind: str, gpu: int, params: dict[str, str]) -> None:
    sim = SimulatedBackend.from_name("h200x8", clock=FakeClock())
    sim.open()
    if kind == "hang":
        params = {}  # a hang blocks the next call: covered by the sampler tests
    try:
        description = sim.inject(kind, gpu, params)
    except ValueError as exc:
        message = str(exc)
        assert message, "a rejected fault says why"
    else:
        assert isinstance(description, str) and description
        sim.clear()
        for i in range(sim.device_count()):
            sim.sample(i)
            sim.processes(i)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[node]\nname='x'\n", "missing key 'card'"),
        ("not toml [", "not valid TOML"),
        ("[node]\n", "missing key"),
    ],
)
def test_bad_scenario_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(str(path))


def test_unknown_scenario_name() -> None:
    with pytest.raises(ScenarioError, match="no such built-in scenario"):
        load_scenario("h100x99")


def test_process_list_denied_is_unknown_only_with_mig_on(sim: SimulatedBackend) -> None:
    """As NVML: an unprivileged caller gets NO_PERMISSION for a MIG card's list, and the full list otherwise."""
    for gpu in (0, 7):  # card 0 MIG off, card 7 MIG on
        sim.inject("process_list_denied", gpu)
    assert sim.processes(7) is UNKNOWN
    assert sim.sample(7).mig_mode_current is True  # the rest of the card answers
    assert [p.pid for p in sim.processes(0)] == [41001]  # type: ignore[union-attr]
    sim.clear(7)
    assert isinstance(sim.processes(7), tuple)


def test_xid_inside_a_mig_instance_carries_its_ids(sim: SimulatedBackend) -> None:
    sim.inject("xid", 7, {"code": "13", "gpu_instance_id": "2"})
    event = sim.wait_event(0.01)
    assert event is not None
    assert (event.gpu_index, event.xid, event.gpu_instance_id, event.compute_instance_id) == (7, 13, 2, 0)
    sim.inject("xid", 7, {"code": "79"})
    whole = sim.wait_event(0.01)
    assert whole is not None and (whole.gpu_instance_id, whole.compute_instance_id) == (None, None)


@pytest.mark.parametrize(
    ("gpu", "params"),
    [
        (7, {"code": "13", "gpu_instance_id": "5"}),  # no such GPU instance on card 7
        (0, {"code": "13", "gpu_instance_id": "1"}),  # MIG off
        (7, {"code": "13", "gpu_instance_id": "1", "compute_instance_id": "3"}),
        (7, {"code": "13", "compute_instance_id": "0"}),
    ],
)
def test_xid_in_an_instance_that_does_not_exist_is_refused(
    sim: SimulatedBackend, gpu: int, params: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="instance"):
        sim.inject("xid", gpu, params)
    assert sim.wait_event(0.01) is None


def test_recovery_action_is_the_raw_driver_value(sim: SimulatedBackend) -> None:
    sim.inject("recovery_action", 2, {"code": "5"})  # R580's bus reset
    assert sim.sample(2).recovery_action == 5
    sim.inject("recovery_action", 2, {"code": "0"})
    assert sim.sample(2).recovery_action == 0
