"""Bad input is refused with the field named; odd but valid input is handled."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scheduler_builders import alloc, job, node, snapshot

from corral.core import GIB, Gpu, InvalidSpec, Node, PriorityClass
from corral.scheduler import Config, schedule


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Config(max_batch_size=0), "config.max_batch_size"),
        (lambda: Config(candidates_per_tier=0), "config.candidates_per_tier"),
        (
            lambda: Config(min_runtime_before_preemption_s=-1),
            "config.min_runtime_before_preemption_s",
        ),
        (lambda: Config(max_placements_per_cycle=-1), "config.max_placements_per_cycle"),
        (lambda: Config(user_weights={"bob": 0}), "config.user_weights.bob"),
        (
            lambda: Config(priority_classes=(PriorityClass("a", 1), PriorityClass("a", 2))),
            "config.priority_classes",
        ),
    ],
)
def test_a_bad_config_names_its_field(make: object, field: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        make()  # type: ignore[operator]
    assert info.value.field == field


def test_duplicate_node_names_are_refused() -> None:
    snap = snapshot([node("n").gpus(1), node("n").gpus(2)], [job("j").gpus(1)])
    with pytest.raises(InvalidSpec) as info:
        schedule(snap)
    assert info.value.field == "snapshot.nodes"
    assert "'n'" in info.value.message


def test_duplicate_job_ids_are_refused() -> None:
    snap = snapshot([node("n").gpus(1)], [job("j").gpus(1), job("j").gpus(1)])
    with pytest.raises(InvalidSpec) as info:
        schedule(snap)
    assert info.value.field == "snapshot.queued"


def test_cards_are_addressed_by_their_index_even_when_one_is_hidden() -> None:
    cards = (Gpu(0, "A100", 80 * GIB), Gpu(2, "A100", 80 * GIB))  # card 1 not visible
    snap = snapshot(allocs=[alloc("x", "n").cards(2)], jobs=[job("a").gpus(1), job("b").gpus(1)])
    snap = replace(snap, nodes=(Node(name="n", gpus=cards, cpus=8),))
    plan = schedule(snap)
    assert [p.gpu_indices for p in plan.placements] == [(0,)]
    assert len(plan.unplaced) == 1


def test_allocations_on_unknown_nodes_do_not_break_the_cycle() -> None:
    snap = snapshot([node("n").gpus(1)], [job("j").gpus(1)], [alloc("ghost", "gone").cards(0)])
    assert [p.node for p in schedule(snap).placements] == ["n"]
