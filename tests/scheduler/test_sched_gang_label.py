"""A gang that requires its replicas on nodes sharing one value of a label."""

from __future__ import annotations

from scheduler_builders import job, node, snapshot

from corral.scheduler import schedule


def test_a_gang_requiring_its_label_waits_rather_than_span_values() -> None:
    nodes = [node("a").gpus(4).label(rack="r1"), node("b").gpus(4).label(rack="r2")]
    bound = job("g").gpus(4).set(replicas=2, gang_label="rack", gang_label_required=True)
    plan = schedule(snapshot(nodes, [bound]))
    assert plan.placements == ()
    assert plan.unplaced[0].job_id == "g"


def test_a_gang_requiring_its_label_goes_where_one_value_has_room() -> None:
    nodes = [
        node("a").gpus(4).label(rack="r1"),
        node("b").gpus(4).label(rack="r2"),
        node("c").gpus(4).label(rack="r2"),
        node("d").gpus(4),  # no rack: never part of a bound gang
    ]
    bound = job("g").gpus(4).set(replicas=2, gang_label="rack", gang_label_required=True)
    plan = schedule(snapshot(nodes, [bound]))
    assert {p.node for p in plan.placements} == {"b", "c"}


def test_a_bound_gang_that_waits_does_not_hold_up_a_free_one() -> None:
    nodes = [node("a").gpus(4).label(rack="r1"), node("b").gpus(4).label(rack="r2")]
    bound = (
        job("g")
        .gpus(4)
        .set(replicas=2, gang_label="rack", gang_label_required=True, submitted_at=0)
    )
    free = job("h").gpus(4).set(replicas=2, submitted_at=1)
    plan = schedule(snapshot(nodes, [bound, free]))
    assert {p.job_ids for p in plan.placements} == {("h",)}
