"""The "any" card order: free capacity first, with the topology's first choice among the cards that fit."""

from __future__ import annotations

from collections.abc import Sequence

from healthd.partition.planner import Quota, pick_card, topology_aware

CANDIDATES = [(2, Quota(60, 40_000)), (5, Quota(60, 40_000)), (7, Quota(100, 140_000)), (1, Quota(10, 1_000))]


def test_free_capacity_order_without_topology() -> None:
    assert pick_card(CANDIDATES, Quota(30, 2048)) == [7, 2, 5, 1]
    assert topology_aware(lambda fitting: None)(CANDIDATES, Quota(30, 2048)) == [7, 2, 5, 1]


def test_topology_choice_goes_first_among_cards_that_fit() -> None:
    asked: list[list[int]] = []

    def first_choice(fitting: Sequence[int]) -> int | None:
        asked.append(list(fitting))
        return 5

    assert topology_aware(first_choice)(CANDIDATES, Quota(30, 2048)) == [5, 7, 2, 1]
    assert asked == [[7, 2, 5]], "card 1 has 10% free: it cannot hold 30% and is never offered to the topology"


def test_memory_decides_fit_for_a_request_without_compute_limit() -> None:
    seen: list[list[int]] = []
    topology_aware(lambda fitting: seen.append(list(fitting)) or None)(CANDIDATES, Quota(0, 1024))
    assert seen == [[7, 2, 5]], "compute 0 (no limit) is admitted as 0 %; card 1's 1000 MiB cannot hold 1 GiB"
