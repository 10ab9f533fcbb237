"""The pure planner: TDM admission never over-commits; MIG choice covers the request, is legal and keeps room."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.backends.scenario import load_scenario
from exporter.backends.types import MigProfile
from healthd.partition.errors import Kind, PartitionError
from healthd.partition.planner import (
    MigChoice,
    Occupied,
    Quota,
    admit_tdm,
    choose_mig,
    covers,
    feasible_starts,
    pick_card,
)

H200 = load_scenario("h200x1").mig_profiles
CARD_MIB = 143771
BY_NAME = {p.name: p for p in H200}


def _error_of(fn: Callable[[], object]) -> PartitionError | None:
    try:
        fn()
    except PartitionError as exc:
        return exc
    return None


quotas = st.builds(Quota, st.integers(0, 100), st.integers(0, CARD_MIB // 128).map(lambda u: u * 128))


@given(st.lists(quotas, max_size=40))
def test_tdm_admission_never_overcommits(requests: list[Quota]) -> None:
    admitted: list[Quota] = []
    for q in requests:
        fits = (
            sum(a.compute_percent for a in admitted) + q.compute_percent <= 100
            and sum(a.memory_mib for a in admitted) + q.memory_mib <= CARD_MIB
        )
        error = _error_of(lambda: admit_tdm(admitted, q, CARD_MIB))  # noqa: B023
        if error is not None:
            assert error.kind is Kind.EXHAUSTED
            assert not fits  # rejected only when it would over-commit
            continue
        assert fits
        admitted.append(q)
    assert sum(a.compute_percent for a in admitted) <= 100
    assert sum(a.memory_mib for a in admitted) <= CARD_MIB


def test_tdm_memory_above_the_card_is_invalid() -> None:
    with pytest.raises(PartitionError) as err:
        admit_tdm([], Quota(10, CARD_MIB + 128), CARD_MIB)
    assert err.value.kind is Kind.INVALID


def _apply(occupied: list[Occupied], choice: MigChoice) -> None:
    occupied.append(Occupied(choice.profile.profile_id, choice.start, choice.size, choice.profile.slice_count))


def _size(p: MigProfile) -> tuple[int, int, int]:
    return (max(n for _, n in p.placements), p.slice_count, p.memory_mib)


@given(
    st.lists(
        st.tuples(
            st.booleans(),  # True: create, False: delete one
            st.integers(0, 100),
            st.integers(0, 144).map(lambda g: g * 1024),
            st.integers(0, 10),
        ),
        max_size=30,
    )
)
def test_mig_choices_are_legal_covering_and_smallest(ops: list[tuple[bool, int, int, int]]) -> None:
    occupied: list[Occupied] = []
    total_sm = max(p.sm_count for p in H200)
    for create, compute, memory, victim in ops:
        if not create:
            if occupied:
                occupied.pop(victim % len(occupied))
            continue
        request = Quota(compute, memory)
        chosen: list[MigChoice] = []
        error = _error_of(lambda: chosen.append(choose_mig(H200, occupied, request)))  # noqa: B023
        if error is not None:
            assert error.kind in (Kind.EXHAUSTED, Kind.INVALID)
            if error.kind is Kind.EXHAUSTED:  # nothing that covers it can be placed
                assert all(not feasible_starts(p, occupied, 7) for p in H200 if covers(p, request, total_sm))
            continue
        choice = chosen[0]
        assert covers(choice.profile, request, total_sm)
        assert (choice.start, choice.size) in choice.profile.placements
        taken = {s for o in occupied for s in o.slices}
        assert not taken & set(range(choice.start, choice.start + choice.size))
        # no strictly smaller covering profile could have been placed
        for p in H200:
            if covers(p, request, total_sm) and _size(p) < _size(choice.profile):
                assert not feasible_starts(p, occupied, 7)
        _apply(occupied, choice)
        assert sum(o.compute_slices for o in occupied) <= 7
        for p in H200:
            assert sum(1 for o in occupied if o.profile_id == p.profile_id) <= p.instance_count


@pytest.mark.parametrize(
    ("compute", "memory_mib", "profile"),
    [
        (10, 0, "1g.18gb"),
        (12, 16384, "1g.18gb"),
        (13, 0, "1g.35gb"),  # 16 SMs are 12.1 % of 132; 26 SMs cover 13 %
        (0, 20480, "1g.35gb"),  # 18 GiB profile has 16 GiB; the 35 GB one is the smallest with 20 GiB
        (20, 0, "2g.35gb"),
        (25, 32768, "3g.71gb"),  # 2g.35gb has 24 % of the SMs
        (45, 0, "3g.71gb"),
        (48, 0, "4g.71gb"),
        (0, 71424, "3g.71gb"),
        (50, 0, "7g.141gb"),
        (100, 143360, "7g.141gb"),
    ],
)
def test_profile_choice(compute: int, memory_mib: int, profile: str) -> None:
    assert choose_mig(H200, [], Quota(compute, memory_mib)).profile.name == profile


def test_request_bigger_than_any_profile_is_invalid() -> None:
    with pytest.raises(PartitionError) as err:
        choose_mig(H200, [], Quota(0, 143360 + 128))
    assert err.value.kind is Kind.INVALID
    assert "7g.141gb" in err.value.message


def test_mig_needs_a_size() -> None:
    with pytest.raises(PartitionError, match="needs compute_percent or memory"):
        choose_mig(H200, [], Quota(0, 0))


def _run(requests: list[Quota]) -> list[MigChoice]:
    occupied: list[Occupied] = []
    out = []
    for q in requests:
        choice = choose_mig(H200, occupied, q)
        _apply(occupied, choice)
        out.append(choice)
    return out


def test_small_instance_leaves_room_for_the_4g_profile() -> None:
    # 4g.71gb can only start at slice 0: a first-fit placement of a 1g at 0 would make it impossible
    small, big = _run([Quota(10, 0), Quota(48, 0)])
    assert small.start != 0
    assert big.profile.name == "4g.71gb"
    assert big.start == 0


def test_2g_goes_high_to_keep_the_4g_placeable() -> None:
    first, second = _run([Quota(20, 0), Quota(48, 0)])
    assert first.profile.name == "2g.35gb"
    assert first.start == 4
    assert second.profile.name == "4g.71gb"


def test_full_layouts_from_the_h200_placement_table() -> None:
    assert len(_run([Quota(10, 0)] * 7)) == 7  # 7 x 1g.18gb
    assert [c.profile.name for c in _run([Quota(20, 0)] * 3 + [Quota(10, 0)])] == ["2g.35gb"] * 3 + ["1g.18gb"]
    assert sorted(c.start for c in _run([Quota(45, 0)] * 2)) == [0, 4]  # 2 x 3g.71gb
    with pytest.raises(PartitionError) as err:
        _run([Quota(10, 0)] * 8)
    assert err.value.kind is Kind.EXHAUSTED


def test_whole_card_blocks_everything() -> None:
    occupied = [Occupied(0, 0, 8, 7)]
    with pytest.raises(PartitionError) as err:
        choose_mig(H200, occupied, Quota(1, 0))
    assert err.value.kind is Kind.EXHAUSTED


def test_foreign_instances_are_respected() -> None:
    # an operator's 3g.71gb at 0 (as on GPU 7 of the h200x8 scenario): ours must go elsewhere
    foreign = [Occupied(BY_NAME["3g.71gb"].profile_id, 0, 4, 3)]
    choice = choose_mig(H200, foreign, Quota(45, 0))
    assert (choice.profile.name, choice.start) == ("3g.71gb", 4)


def test_pick_card_prefers_free_capacity() -> None:
    order = pick_card([(0, Quota(10, 1000)), (1, Quota(90, 500)), (2, Quota(90, 800))], Quota(5, 128))
    assert order == [2, 1, 0]
