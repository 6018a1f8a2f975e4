"""The last plan's placements as the kept scheduler checks them off (``planned.Planned``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.scheduler.api import Placement
from corral.scheduler.planned import Planned


def _placements(count: int) -> tuple[Placement, ...]:
    return tuple(Placement(f"a{i}", (f"j{i}",), "n", gpu_indices=(0,)) for i in range(count))


def test_starts_in_the_plan_s_order_are_checked_off_one_by_one() -> None:
    placements = _placements(3)
    planned = Planned(placements)
    assert planned.take("a0") is placements[0]
    assert planned.left() == list(placements[1:])
    assert planned.take("a1") is placements[1]
    assert planned.take("a2") is placements[2]
    assert planned.left() == []
    assert planned.take("a2") is None, "checked off once"


@given(st.integers(0, 8), st.lists(st.integers(0, 10), max_size=16))
def test_any_order_of_starts_finds_each_placement_once_and_leaves_the_rest(
    count: int, starts: list[int]
) -> None:
    """Starts in any order, of placements of the plan or not, repeated or not: each
    placement is found once, by its allocation id, and what is left is the plan's
    placements not yet found, in the plan's order."""
    placements = _placements(count)
    planned = Planned(placements)
    found: set[str] = set()
    for i in starts:
        alloc_id = f"a{i}"
        got = planned.take(alloc_id)
        if i < count and alloc_id not in found:
            assert got is placements[i]
            found.add(alloc_id)
        else:
            assert got is None
        assert planned.left() == [p for p in placements if p.allocation_id not in found]
