"""The victims' index, kept across starts and ends, holds after each of them what a walk of
the allocations then running gives: by node, by job set, each team's milli per
node and each node's milli (only what may be evicted, CPU offload counting nothing; work
on a node the scheduler does not hold is in the job sets only)."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from corral.core.model import Allocation, PriorityClass
from corral.core.states import AllocDesired
from corral.scheduler.slots import NOWHERE, Slot, TeamNumbers
from corral.scheduler.victims import VictimIndex

RUN = AllocDesired.RUN
CLASSES = {
    "free": PriorityClass("free", 0),
    "locked": PriorityClass("locked", 5, preemptible=False),
}

NODES = {"node-0": 0, "node-1": 1}  # "node-2" is not held: its index is NOWHERE

# Two allocations of one team on one node: the first to end leaves the team's entry there,
# the second takes it away (a count of the team's allocations there says when).
_PAIR = [
    Allocation(f"a{n}", (f"j{n}",), "node-0", team="t0", gpu_indices=(n,), gpu_milli=1000)
    for n in range(2)
]


# Three replicas of a gang on two nodes: ending the middle one, then the latest indexed,
# unlinks each from its job's chain (``Slot.kin``).
_GANG = [
    Allocation(f"r{n}", ("g",), f"node-{n % 2}", team="t0", gpu_indices=(0,), gpu_milli=1000)
    for n in range(3)
]
_GANG_SCRIPT = [("start", 0), ("start", 1), ("start", 2), ("end", 1)]


@st.composite
def allocations(draw: st.DrawFn) -> list[Allocation]:
    """Allocations on two nodes of two teams (so that many share both; a few on a node not
    held); some share a job set (a gang's replicas), some may not be evicted (their own
    flag or their class), some run on CPU slots."""
    out = []
    for n in range(draw(st.integers(4, 12))):
        gang = draw(st.integers(0, 3))  # 0: a job of its own; else one of three gangs
        gpus = draw(st.integers(0, 2))
        out.append(
            Allocation(
                f"a{n}",
                (f"j{n}",) if gang == 0 else (f"gang{gang}",) * draw(st.sampled_from([1, 1, 2])),
                f"node-{draw(st.sampled_from([0, 0, 0, 1, 1, 1, 2]))}",
                team=f"t{draw(st.integers(0, 1))}",
                priority=draw(st.sampled_from(["free", "free", "free", "locked"])),
                gpu_indices=tuple(range(gpus)),
                gpu_milli=draw(st.sampled_from([250, 1000])) if gpus else 0,
                on_cpu=draw(st.booleans()) if gpus else False,
                preemptible=draw(st.sampled_from([True, True, True, False])),
                desired=draw(
                    st.sampled_from([AllocDesired.RUN, AllocDesired.RUN, AllocDesired.STOP])
                ),
            )
        )
    return out


# A script: ("start", i) starts allocation i if it is not running, ("end", i) ends it if it
# is; starts come most often, so that much runs at once.
step = st.tuples(st.sampled_from(["start"] * 5 + ["end"] * 3), st.integers(0, 11))
steps = st.lists(step, min_size=4, max_size=80)


@given(allocations(), steps)
@example(_PAIR, [("start", 0), ("start", 1), ("end", 0)])
@example(_PAIR, [("start", 0), ("start", 1), ("end", 0), ("end", 1)])
@example(_GANG, [*_GANG_SCRIPT, ("end", 2)])
def test_the_index_holds_what_a_walk_of_the_running_allocations_gives_after_each_change(
    allocs: list[Allocation], script: list[tuple[Any, ...]]
) -> None:
    index = VictimIndex(dict(CLASSES), len(NODES))
    teams = TeamNumbers()
    running: dict[str, Slot] = {}  # a new slot per start, as the scheduler gives
    for kind, which in script:
        if which >= len(allocs):
            continue
        alloc = allocs[which]
        if kind == "start" and alloc.id not in running:
            slot = Slot(alloc, None, teams.number(alloc.team), NODES.get(alloc.node, NOWHERE))
            running[alloc.id] = slot
            index.add(slot)
        elif kind == "end" and alloc.id in running:
            index.remove(running.pop(alloc.id))
        assert _maps(index) == _walk(s.alloc for s in running.values())


def _maps(index: VictimIndex) -> tuple[object, ...]:
    """The index's maps, as dicts (its lists of slots by allocation id; nodes without
    evictable work left out, after checking they count nothing)."""
    on_node = {n: {s.alloc.id: s.alloc for s in here.slots} for n, here in enumerate(index.nodes)}
    for n, slots in on_node.items():
        assert slots or index.nodes[n].milli == 0
        assert slots or all(held.count == held.milli == 0 for held in index.nodes[n].teams)
    by_jobs: dict[tuple[str, ...], dict[str, Allocation]] = {}
    for first, head in index.by_jobs.items():
        kin: Slot | None = head
        while kin is not None:
            assert kin.alloc.job_ids[0] == first
            by_jobs.setdefault(kin.alloc.job_ids, {})[kin.alloc.id] = kin.alloc
            kin = kin.kin
    node_milli = {n: here.milli for n, here in enumerate(index.nodes) if on_node[n]}
    name = {n: next(iter(slots.values())).node for n, slots in on_node.items() if slots}
    team_nodes = {t: {name[n]: milli for n, milli in index.nodes_of(t)} for t in index.teams()}
    on_node = {n: slots for n, slots in on_node.items() if slots}
    return on_node, by_jobs, team_nodes, node_milli


def _walk(running: Any) -> tuple[object, ...]:
    """The four maps, built from scratch from the running allocations."""
    on_node: dict[int, dict[str, Allocation]] = {}
    by_jobs: dict[tuple[str, ...], dict[str, Allocation]] = {}
    team_nodes: dict[str, dict[str, int]] = {}
    node_milli: dict[int, int] = {}
    for a in running:
        if a.desired is not AllocDesired.RUN:
            continue
        by_jobs.setdefault(a.job_ids, {})[a.id] = a
        node = NODES.get(a.node)
        if node is None or not (a.preemptible and CLASSES[a.priority].preemptible):
            continue
        milli = 0 if a.on_cpu else a.milli
        on_node.setdefault(node, {})[a.id] = a
        nodes = team_nodes.setdefault(a.team, {})
        nodes[a.node] = nodes.get(a.node, 0) + milli
        node_milli[node] = node_milli.get(node, 0) + milli
    return on_node, by_jobs, team_nodes, node_milli


def test_a_unit_is_one_job_set_whole_even_where_sets_share_a_first_job() -> None:
    """A gang's replicas are one victim; an allocation whose job set begins with the same
    job (a set filed under the same key) is another."""
    gang = [
        Allocation(f"r{n}", ("g",), f"node-{n}", team="t0", gpu_indices=(0,), gpu_milli=1000)
        for n in range(2)
    ]
    other = Allocation("b", ("g", "h"), "node-0", team="t0", gpu_indices=(1,), gpu_milli=1000)
    index = VictimIndex(dict(CLASSES), len(NODES))
    for alloc in [*gang, other]:
        index.add(Slot(alloc, None, 0, NODES[alloc.node]))
    units = sorted(tuple(a.id for a in v.allocs) for v in index.units(0, 0.0))
    assert units == [("b",), ("r0", "r1")]


def test_slots_indexed_again_in_a_new_index_make_one_unit_per_gang() -> None:
    # When the scheduler's nodes change it files its running slots in a new index; their
    # chains of kin from the old one must not carry over (a chain that loops back made
    # ``units`` walk for ever).
    teams = TeamNumbers()
    slots = [Slot(a, None, teams.number(a.team), NODES[a.node]) for a in _GANG]
    old = VictimIndex(CLASSES, len(NODES))
    for slot in slots:
        old.add(slot)
    new = VictimIndex(CLASSES, len(NODES))
    for slot in slots:
        new.add(slot)
    for node in NODES.values():
        units = new.units(node, now=10.0)
        assert [[a.id for a in u.allocs] for u in units] == [["r0", "r1", "r2"]]
    assert _maps(new) == _walk(_GANG)
