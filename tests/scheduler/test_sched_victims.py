"""The victims' index, kept lazily across starts and ends, holds after each ``settle`` what
a walk of the allocations then running gives: by node, by job set, each team's milli per
node and each node's milli (only what may be evicted, CPU offload counting nothing)."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from corral.core.model import Allocation, PriorityClass
from corral.core.states import AllocDesired
from corral.scheduler.victims import VictimIndex

RUN = AllocDesired.RUN
CLASSES = {
    "free": PriorityClass("free", 0),
    "locked": PriorityClass("locked", 5, preemptible=False),
}

# Two allocations of one team on one node: the first to end leaves the team's entry there.
_PAIR = [
    Allocation(f"a{n}", (f"j{n}",), "node-0", team="t0", gpu_indices=(n,), gpu_milli=1000)
    for n in range(2)
]


@st.composite
def allocations(draw: st.DrawFn) -> list[Allocation]:
    """Allocations on two nodes of two teams (so that many share both); some share a job
    set (a gang's replicas), some may not be evicted (their own flag or their class),
    some run on CPU slots."""
    out = []
    for n in range(draw(st.integers(4, 12))):
        gang = draw(st.integers(0, 3))  # 0: a job of its own; else one of three gangs
        gpus = draw(st.integers(0, 2))
        out.append(
            Allocation(
                f"a{n}",
                (f"j{n}",) if gang == 0 else (f"gang{gang}",),
                f"node-{draw(st.integers(0, 1))}",
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
# is, ("settle",) settles and compares; starts come most often, so that much runs at once.
step = st.integers(0, 9).flatmap(
    lambda kind: (
        st.just(("settle",))
        if kind >= 8
        else st.tuples(st.just("start" if kind < 5 else "end"), st.integers(0, 11))
    )
)
steps = st.lists(step, min_size=4, max_size=80)


@given(allocations(), steps)
@example(_PAIR, [("start", 0), ("start", 1), ("settle",), ("end", 0), ("settle",)])
def test_a_settled_index_holds_what_a_walk_of_the_running_allocations_gives(
    allocs: list[Allocation], script: list[tuple[Any, ...]]
) -> None:
    index = VictimIndex(dict(CLASSES))
    running: dict[str, Allocation] = {}
    for step in [*script, ("settle",)]:
        if step[0] == "settle":
            index.settle()
            assert _maps(index) == _walk(running.values())
            continue
        if step[1] >= len(allocs):
            continue
        alloc = allocs[step[1]]
        if step[0] == "start" and alloc.id not in running:
            running[alloc.id] = alloc
            index.add(alloc)
        elif step[0] == "end" and alloc.id in running:
            del running[alloc.id]
            index.remove(alloc)


def _maps(index: VictimIndex) -> tuple[object, ...]:
    return index.on_node, index.by_jobs, index.team_nodes, index.node_milli


def _walk(running: Any) -> tuple[object, ...]:
    """The four maps, built from scratch from the running allocations."""
    on_node: dict[str, dict[str, Allocation]] = {}
    by_jobs: dict[tuple[str, ...], dict[str, Allocation]] = {}
    team_nodes: dict[str, dict[str, int]] = {}
    node_milli: dict[str, int] = {}
    for a in running:
        if a.desired is not AllocDesired.RUN:
            continue
        by_jobs.setdefault(a.job_ids, {})[a.id] = a
        if not (a.preemptible and CLASSES[a.priority].preemptible):
            continue
        milli = 0 if a.on_cpu else a.milli
        on_node.setdefault(a.node, {})[a.id] = a
        nodes = team_nodes.setdefault(a.team, {})
        nodes[a.node] = nodes.get(a.node, 0) + milli
        node_milli[a.node] = node_milli.get(a.node, 0) + milli
    return on_node, by_jobs, team_nodes, node_milli
