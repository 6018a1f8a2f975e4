import pytest

from corral.core import (
    ALLOCATION,
    JOB,
    NODE,
    AllocObserved,
    IllegalTransition,
    JobState,
    Transition,
    transition,
)
from corral.core.lifecycle import Lifecycle, S
from corral.core.states import DESIRED


def test_every_edge_of_every_lifecycle_is_explained() -> None:
    for lifecycle in (JOB, NODE, ALLOCATION, DESIRED):
        for edge, why in lifecycle.edges.items():
            assert why.strip(), f"{lifecycle.name} edge {edge} has no comment"


def test_terminal_states_have_no_way_out() -> None:
    for lifecycle in (JOB, ALLOCATION):
        for current, _ in lifecycle.edges:
            assert current not in lifecycle.terminal


def test_the_gate_allows_exactly_the_table_s_edges() -> None:
    # the gate reads each state's targets (``Lifecycle.targets``), derived from the edges
    _gate_follows_table(JOB)
    _gate_follows_table(NODE)
    _gate_follows_table(ALLOCATION)
    _gate_follows_table(DESIRED)


def test_an_edge_the_gate_found_allowed_is_allowed_for_its_own_lifecycle_only() -> None:
    # The gate remembers edges it found in their tables (matched by identity, a short
    # scan): a second pass over every table gets the same answers, and an edge allowed
    # by one table is not thereby allowed by another over the same states.
    for _ in range(2):
        _gate_follows_table(JOB)
        _gate_follows_table(ALLOCATION)
    loose = Lifecycle("loose", {(JobState.QUEUED, JobState.SUCCEEDED): "test"}, frozenset())
    strict = Lifecycle("strict", {(JobState.QUEUED, JobState.RUNNING): "test"}, frozenset())
    for _ in range(2):
        assert transition(loose, "x", JobState.QUEUED, JobState.SUCCEEDED, at=0, why="") is (
            JobState.SUCCEEDED
        )
        with pytest.raises(IllegalTransition):
            transition(strict, "x", JobState.QUEUED, JobState.SUCCEEDED, at=0.0, why="")
        with pytest.raises(IllegalTransition):
            transition(JOB, "x", JobState.QUEUED, JobState.SUCCEEDED, at=0.0, why="")


def _gate_follows_table(lifecycle: Lifecycle[S]) -> None:
    states = {state for edge in lifecycle.edges for state in edge}
    for current in states:
        for target in states:
            edge = (current, target) in lifecycle.edges
            assert lifecycle.allows(current, target) is edge, (lifecycle.name, current, target)
            if edge:
                assert transition(lifecycle, "x", current, target, at=0.0, why="") is target
            else:
                with pytest.raises(IllegalTransition):
                    transition(lifecycle, "x", current, target, at=0.0, why="")


def test_the_gate_records_history_in_order() -> None:
    history: list[Transition] = []
    state = transition(
        JOB, "j1", JobState.QUEUED, JobState.PLACED, at=1.0, why="placed", history=history
    )
    state = transition(JOB, "j1", state, JobState.RUNNING, at=2.0, why="started", history=history)
    state = transition(JOB, "j1", state, JobState.QUEUED, at=3.0, why="node lost", history=history)
    assert state is JobState.QUEUED
    assert [(h.current, h.target, h.at) for h in history] == [
        ("queued", "placed", 1.0),
        ("placed", "running", 2.0),
        ("running", "queued", 3.0),
    ]
    assert history[-1].why == "node lost"


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (JobState.SUCCEEDED, JobState.RUNNING),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.CANCELLED, JobState.QUEUED),
    ],
)
def test_the_gate_refuses_edges_the_table_lacks(current: JobState, target: JobState) -> None:
    history: list[Transition] = []
    with pytest.raises(IllegalTransition) as info:
        transition(JOB, "j1", current, target, at=0.0, why="x", history=history)
    assert info.value.current == current.value
    assert history == []


def test_allocation_lifecycle_allows_loss_from_pending_and_running() -> None:
    assert ALLOCATION.allows(AllocObserved.PENDING, AllocObserved.LOST)
    assert ALLOCATION.allows(AllocObserved.RUNNING, AllocObserved.LOST)
    assert not ALLOCATION.allows(AllocObserved.SUCCEEDED, AllocObserved.LOST)
