"""The kept scheduler's books by slot and number agree with a walk of its allocations.

``Scheduler`` keeps each allocation in a slot (``slots.py``) with its expected end, its
team's number and its node's index, a list of slots per node, milli-GPUs per team number
and the latest expected end per node index (in a map and a list). After any sequence of
starts, ends and changes of nodes, all of them must be what a walk of the allocations
held gives, and each slot must be where its node's list says (``Slot.at``,
``Slot.victim_at``). Starting an id held already is refused and changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from corral.core import Gpu, InvalidSpec, Node
from corral.core.model import Allocation
from corral.core.states import AllocDesired, AllocObserved
from corral.scheduler import Scheduler
from corral.scheduler.slots import NOWHERE

RUNNING = AllocObserved.RUNNING

CARDS = tuple(Gpu(g, "A100", 80 << 30) for g in range(4))
NODES = tuple(Node(f"node-{i}", gpus=CARDS, cpus=16) for i in range(3))

# Three running on one node: the first to end leaves its place to the last one.
_THREE = [
    Allocation(f"a{n}", (f"j{n}",), "node-0", gpu_indices=(n,), gpu_milli=1000, observed=RUNNING)
    for n in range(3)
]


@st.composite
def allocations(draw: st.DrawFn) -> list[Allocation]:
    """Allocations on three nodes (and one never held) of three teams: some inactive, some
    on CPU slots, some not meant to run any more (``desired`` stop)."""
    out = []
    for n in range(draw(st.integers(3, 12))):
        gpus = draw(st.integers(0, 2))
        out.append(
            Allocation(
                f"a{n}",
                (f"j{n}",),
                f"node-{draw(st.integers(0, 3))}",
                team=f"t{draw(st.integers(0, 2))}",
                gpu_indices=tuple(range(gpus)),
                gpu_milli=draw(st.sampled_from([250, 1000])) if gpus else 0,
                cpus=1,
                on_cpu=draw(st.booleans()) if gpus else False,
                desired=draw(st.sampled_from([AllocDesired.RUN, AllocDesired.STOP])),
                observed=draw(st.sampled_from([RUNNING, RUNNING, AllocObserved.SUCCEEDED])),
            )
        )
    return out


# ("start", i, end) starts allocation i if not held, with that expected end (None: not
# known); ("end", i) ends it if held; ("nodes", keep) keeps the nodes named by the mask.
step = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 11), st.none() | st.integers(0, 5).map(float)),
    st.tuples(st.just("end"), st.integers(0, 11)),
    st.tuples(st.just("nodes"), st.integers(0, 7)),
)


@given(allocations(), st.lists(step, min_size=1, max_size=40))
@example(_THREE, [("start", 0, 1.0), ("start", 1, None), ("start", 2, 3.0), ("end", 0)])
def test_the_books_by_slot_agree_with_a_walk_of_the_allocations(
    allocs: list[Allocation], script: list[tuple[Any, ...]]
) -> None:
    sched = Scheduler(NODES)
    held: dict[str, tuple[Allocation, float | None]] = {}
    for step in script:
        if step[0] == "nodes":
            sched.set_nodes(tuple(n for i, n in enumerate(NODES) if step[1] >> i & 1))
        elif step[1] >= len(allocs):
            continue
        elif step[0] == "start" and allocs[step[1]].id in held:
            with pytest.raises(InvalidSpec, match="duplicate"):
                sched.start(allocs[step[1]], step[2])
        elif step[0] == "start":
            held[allocs[step[1]].id] = (allocs[step[1]], step[2])
            sched.start(allocs[step[1]], step[2])
        elif step[0] == "end" and allocs[step[1]].id in held:
            assert sched.end(allocs[step[1]].id) is held.pop(allocs[step[1]].id)[0]
        _check(sched, held)
    for node, here in enumerate(sched._victims.nodes):
        victims = here.slots
        assert [slot.victim_at for slot in victims] == list(range(len(victims)))
        assert {slot.alloc.node for slot in victims} <= {sched.nodes[node].name}


def _check(sched: Scheduler, held: dict[str, tuple[Allocation, float | None]]) -> None:
    """Every book of ``sched`` is what a walk of ``held`` (id -> allocation, end) gives."""
    assert sched.allocations == {a: alloc for a, (alloc, _) in held.items()}
    assert sched.expected_ends == {a: end for a, (_, end) in held.items() if end is not None}
    index = {node.name: i for i, node in enumerate(sched.nodes)}
    teams = sched._team_numbers
    used = [0] * len(teams.names)
    here: list[set[str]] = [set() for _ in sched.nodes]
    ends: dict[int, float] = {}
    for alloc_id, slot in sched._slots.of.items():
        alloc, end = held[alloc_id]
        assert (slot.alloc, slot.end) == (alloc, end)
        assert teams.names[slot.team] == alloc.team
        assert slot.node == index.get(alloc.node, NOWHERE)
        if not alloc.active:
            continue
        used[slot.team] += 0 if alloc.on_cpu else alloc.milli
        if slot.node != NOWHERE:
            here[slot.node].add(alloc_id)
            if end is not None:
                ends[slot.node] = max(end, ends.get(slot.node, end))
    assert [tally.milli for tally in sched._used] == used
    assert [{slot.alloc.id for slot in work} for work in sched._here] == here
    for work in sched._here:
        assert [slot.at for slot in work] == list(range(len(work)))
    assert sched._end_at == [ends.get(node) for node in range(len(sched.nodes))]
