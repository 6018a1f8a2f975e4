"""A kept scheduler's books after any starts, ends and changes of nodes.

``Scheduler`` keeps what each allocation holds, its expected end, its team's usage and
its node's work as allocations start and end. After any sequence of starts, ends and
changes of nodes, it holds exactly the allocations started and not ended, and it plans
as a scheduler made afresh from those allocations does: the same placements and
preemptions for the same queued jobs. Starting an id held already is refused and
changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from corral.core import GIB, Gpu, InvalidSpec, Job, Node, ResourceRequest, Team
from corral.core.model import Allocation
from corral.core.states import AllocDesired, AllocObserved
from corral.scheduler import Scheduler, Snapshot, schedule

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
def test_a_kept_scheduler_holds_and_plans_as_one_made_from_its_allocations(
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
    _check_plans(sched, held)


TEAMS = tuple(Team(f"t{n}", quota_gpus=1, borrow_limit_gpus=1) for n in range(3))
PROBES = (  # queued jobs whose placement depends on the cards, usage and ends held
    Job("p0", ResourceRequest(gpus=1), team="t0", priority="interactive", estimated_runtime_s=2),
    Job("p1", ResourceRequest(gpus=2), team="t1", submitted_at=1.0),
    Job("p2", ResourceRequest(gpu_milli=250, vram_bytes=GIB), team="t2", submitted_at=2.0),
    Job("p3", ResourceRequest(gpus=4), team="t0", priority="interactive", submitted_at=3.0),
    Job("p4", ResourceRequest(cpus=2), team="t1", submitted_at=4.0),
)


def _check(sched: Scheduler, held: dict[str, tuple[Allocation, float | None]]) -> None:
    """``sched`` holds what ``held`` (id -> allocation, expected end) says."""
    assert sched.allocations == {a: alloc for a, (alloc, _) in held.items()}
    assert sched.expected_ends == {a: end for a, (_, end) in held.items() if end is not None}


def _check_plans(sched: Scheduler, held: dict[str, tuple[Allocation, float | None]]) -> None:
    """``sched`` plans for the probe jobs as a plan from scratch of the same state does."""
    fresh = Snapshot(
        nodes=sched.nodes,
        queued=PROBES,
        allocations=tuple(alloc for alloc, _ in held.values()),
        teams=TEAMS,
        expected_ends={a: end for a, (_, end) in held.items() if end is not None},
    )
    sched.set_teams(TEAMS)
    for probe in PROBES:
        sched.submit(probe)
    kept, scratch = sched.schedule(now=0.5), schedule(fresh, now=0.5)
    assert kept.placements == scratch.placements
    assert kept.preemptions == scratch.preemptions
