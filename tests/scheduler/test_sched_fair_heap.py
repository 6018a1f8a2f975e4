"""The fair queue's own heap of users (each its own entry) pops what ``heapq`` pops, the
same objects in the same order, ties (equal entries) included: it is ``heapq``'s algorithm
written out."""

from __future__ import annotations

import heapq

from hypothesis import given
from hypothesis import strategies as st

from corral.scheduler.lines import Line
from corral.scheduler.ordering import _heapify, _pop, _push, _User

Key = tuple[float, float, float, str]

# (vt, tie, at, job id) from small ranges: many entries equal in some fields, some in all
keys = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from([0.0, 1.0]),
    st.sampled_from([0.0, 1.0, 2.0]),
    st.sampled_from(["a", "b"]),
)
ops = st.lists(st.one_of(keys, st.none()), max_size=60)  # a key: push it; None: pop


def entry(key: Key) -> _User[str]:
    user: _User[str] = _User("u", Line())
    user.queued_vt, user.tie, user.at, user.job_id = key
    return user


@given(st.lists(keys, max_size=30), ops)
def test_pushes_and_pops_match_heapq_object_for_object(
    start: list[tuple[float, float, float, str]],
    steps: list[tuple[float, float, float, str] | None],
) -> None:
    ours = [entry(k) for k in start]
    theirs = list(ours)
    _heapify(ours)
    heapq.heapify(theirs)
    assert [id(e) for e in ours] == [id(e) for e in theirs]
    for step in steps:
        if step is None:
            if not theirs:
                continue
            assert _pop(ours) is heapq.heappop(theirs)
        else:
            made = entry(step)
            _push(ours, made)
            heapq.heappush(theirs, made)
        assert [id(e) for e in ours] == [id(e) for e in theirs]
    while theirs:
        assert _pop(ours) is heapq.heappop(theirs)
    assert not ours


def test_before_is_the_order_of_the_entries_as_tuples() -> None:
    fields = [
        (v, t, a, j) for v in (0.0, 1.0) for t in (0.0, 1.0) for a in (0.0, 1.0) for j in "ab"
    ]
    for x in fields:
        for y in fields:
            assert entry(x).before(entry(y)) == (x < y)
