"""Invariants of ``schedule`` on generated clusters (hypothesis).

Each ``check_*`` is one invariant, run on every generated case of two
generators: varied small clusters with running work (``situations``), and
full clusters where owed work arrives (``crowded``: preemption country).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_strategies import crowded, situations

from corral.core import MILLI, Allocation, Gpu, Job, Node, ResourceRequest
from corral.scheduler import Config, Placement, Plan, Snapshot, passes, schedule
from corral.scheduler.quota import Ledger

Case = tuple[Snapshot, Config, float]


@settings(max_examples=120, deadline=None)
@given(situations(), st.integers(0, 2**32))
def test_every_plan_on_varied_clusters_keeps_every_invariant(case: Case, seed: int) -> None:
    check_all(case, seed)


@settings(max_examples=150, deadline=None)
@given(crowded(), st.integers(0, 2**32))
def test_every_plan_on_crowded_clusters_keeps_every_invariant(case: Case, seed: int) -> None:
    check_all(case, seed)


def check_all(case: Case, seed: int) -> None:
    snapshot, config, now = case
    plan = schedule(snapshot, config, now, seed)
    assert plan == schedule(snapshot, config, now, seed), "not deterministic for a seed"
    check_no_card_node_or_cpu_is_over_committed(snapshot, plan)
    check_placements_honour_every_constraint(snapshot, plan, now)
    check_every_queued_job_is_decided_once_and_gangs_are_all_or_nothing(snapshot, plan)
    check_a_team_never_exceeds_quota_plus_borrowing(snapshot, plan)
    check_preemption_is_lawful_and_never_in_vain(snapshot, plan, config, now)


def check_no_card_node_or_cpu_is_over_committed(snapshot: Snapshot, plan: Plan) -> None:
    evicted = {p.allocation_id for p in plan.preemptions}
    milli: Counter[tuple[str, int]] = Counter()
    vram: Counter[tuple[str, int]] = Counter()
    cpus: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    holders = [a for a in snapshot.allocations if a.active and a.id not in evicted]
    items: list[Allocation | Placement] = [*holders, *plan.placements]
    for item in items:
        cpus[item.node] += item.cpus
        memory[item.node] += item.memory_bytes
        if item.on_cpu:
            continue
        for card in item.gpu_indices:
            milli[(item.node, card)] += item.gpu_milli
            vram[(item.node, card)] += item.vram_bytes
    by_name = {n.name: n for n in snapshot.nodes}
    for (name, card), used in milli.items():
        assert used <= MILLI, f"{name} card {card}: {used} milli"
        assert vram[(name, card)] <= by_name[name].gpus[card].vram_bytes
    for name, used in cpus.items():
        assert used <= by_name[name].cpus
    for name, used in memory.items():
        assert used <= by_name[name].memory_bytes, f"{name}: {used} bytes of memory"


def check_placements_honour_every_constraint(snapshot: Snapshot, plan: Plan, now: float) -> None:
    by_name = {n.name: n for n in snapshot.nodes}
    jobs = {j.id: j for j in snapshot.queued}
    for p in plan.placements:
        node = by_name[p.node]
        assert node.schedulable
        for job_id in p.job_ids:
            job = jobs[job_id]
            assert job.not_before <= now
            assert all(node.labels.get(k) == v for k, v in job.node_selector.items())
            assert job.backend is None or job.backend in node.backends
            _check_cards(job.resources, p.gpu_indices, p.on_cpu, node.gpus)


def _check_cards(res: ResourceRequest, cards: tuple[int, ...], on_cpu: bool, gpus: tuple) -> None:  # type: ignore[type-arg]
    if on_cpu or not res.wants_gpu:
        assert cards == ()
        return
    assert len(cards) == (res.gpus or 1)
    assert len(set(cards)) == len(cards)
    for c in cards:
        assert not res.gpu_models or gpus[c].model in res.gpu_models
        if res.gpus:
            assert gpus[c].vram_bytes >= res.vram_bytes


def check_every_queued_job_is_decided_once_and_gangs_are_all_or_nothing(
    snapshot: Snapshot, plan: Plan
) -> None:
    placed: Counter[str] = Counter(j for p in plan.placements for j in p.job_ids)
    left = [u.job_id for u in plan.unplaced]
    assert len(left) == len(set(left))
    assert not set(left) & set(placed)
    assert set(left) | set(placed) == {j.id for j in snapshot.queued}
    for job in snapshot.queued:
        assert placed[job.id] in (0, job.replicas)


def check_a_team_never_exceeds_quota_plus_borrowing(snapshot: Snapshot, plan: Plan) -> None:
    before = Ledger(snapshot.teams, snapshot.allocations)
    after = _usage_after(snapshot, plan)
    for team in snapshot.teams:
        limit = before.limit(team.name)
        if limit is not None:
            assert after[team.name] <= max(limit, before.used(team.name))


def check_preemption_is_lawful_and_never_in_vain(
    snapshot: Snapshot, plan: Plan, config: Config, now: float
) -> None:
    ranks = {c.name: c for c in config.priority_classes}
    allocs = {a.id: a for a in snapshot.allocations}
    jobs = {j.id: j for j in snapshot.queued}
    before = Ledger(snapshot.teams, snapshot.allocations)
    preempts = {v for p in plan.placements for v in p.preempts}
    placed_jobs = {j for p in plan.placements for j in p.job_ids}
    for pre in plan.preemptions:
        victim, job = allocs[pre.allocation_id], jobs[pre.for_job]
        assert pre.for_job in placed_jobs, "evicted for a job that then did not run"
        assert pre.allocation_id in preempts
        assert victim.preemptible
        assert ranks[victim.priority].preemptible
        assert now - victim.started_at >= config.min_runtime_before_preemption_s
        assert ranks[victim.priority].rank <= ranks[job.priority].rank
        if pre.move_to:  # a consolidation move: one allocation, to another node, for a job
            assert pre.move_to != victim.node  # the waiting job is placed where it left
            assert sum(1 for a in allocs.values() if a.job_ids == victim.job_ids) == 1
            assert victim.node in {p.node for p in plan.placements if pre.for_job in p.job_ids}
        elif victim.team == job.team:
            assert ranks[job.priority].can_preempt
            assert ranks[victim.priority].rank < ranks[job.priority].rank
        else:
            assert before.over_quota(victim.team)


@settings(max_examples=60, deadline=None)
@given(
    users=st.integers(2, 8),
    flood=st.integers(20, 300),
    spare=st.integers(0, 4),
)
def test_a_flood_from_one_user_delays_others_by_at_most_one_round(
    users: int, flood: int, spare: int
) -> None:
    """With room for one round (one job per user) plus a few, every other user's job runs."""
    jobs = [
        Job(
            id=f"flood{i}", resources=ResourceRequest(gpus=1), user="flooder", submitted_at=float(i)
        )
        for i in range(flood)
    ]
    jobs += [
        Job(id=f"one{u}", resources=ResourceRequest(gpus=1), user=f"user{u}", submitted_at=1e6 + u)
        for u in range(users - 1)
    ]
    node = Node(name="n", gpus=tuple(Gpu(i, "A100", 1) for i in range(users + spare)), cpus=999)
    plan = schedule(Snapshot(nodes=(node,), queued=tuple(jobs)))
    placed = {j for p in plan.placements for j in p.job_ids}
    assert {f"one{u}" for u in range(users - 1)} <= placed
    positions = {u.job_id: u.position for u in plan.unplaced}
    assert all(positions[j] >= users for j in positions)


def _usage_after(snapshot: Snapshot, plan: Plan) -> dict[str, int]:
    evicted = {p.allocation_id for p in plan.preemptions}
    usage: dict[str, int] = defaultdict(int)
    for a in snapshot.allocations:
        if a.active and not a.on_cpu and a.id not in evicted:
            usage[a.team] += a.milli
    jobs = {j.id: j for j in snapshot.queued}
    for p in plan.placements:
        if not p.on_cpu:
            usage[jobs[p.job_ids[0]].team] += p.gpu_milli * len(p.gpu_indices)
    return usage


@settings(max_examples=100, deadline=None)
@given(situations(), st.data())
def test_passing_over_nodes_never_decides_whether_a_lone_job_runs(
    case: Case, data: st.DataObject
) -> None:
    """``Job.avoid_nodes`` (a retry passing over where it failed) only moves a job: placed
    with it iff placed without, and passing over every node is no preference at all."""
    snapshot, config, now = case
    lone = [j for j in snapshot.queued if j.replicas == 1 and j.model is None]
    if not lone or not snapshot.nodes:
        return
    job = lone[0]
    names = [n.name for n in snapshot.nodes]
    avoid = frozenset(data.draw(st.lists(st.sampled_from(names), unique=True)))
    alone = replace(snapshot, queued=(job,))
    retry = replace(snapshot, queued=(replace(job, avoid_nodes=avoid),))
    plain, passed = schedule(alone, config, now), schedule(retry, config, now)
    assert bool(plain.placements) == bool(passed.placements), (avoid, plain, passed)
    if avoid == frozenset(names):
        assert where(passed) == where(plain)
    elif passed.placements and where(plain)[0][0] not in avoid:
        assert passed.placements[0].node not in avoid
    check_all((retry, config, now), 0)


def where(plan: Plan) -> list[tuple[str, tuple[int, ...], bool]]:
    return [(p.node, p.gpu_indices, p.on_cpu) for p in plan.placements]


@settings(max_examples=150, deadline=None)
@given(st.one_of(situations(), crowded()), st.integers(0, 2**32))
def test_the_borrowing_pass_makes_the_same_plan_with_every_team_queue_made_up_front(
    case: Case, seed: int
) -> None:
    """The borrowing pass makes no fair queue for a team with no job left to hand out:
    invisible in the plan, against making every team's queue."""
    if passes.__file__ is None or not passes.__file__.endswith(".py"):
        pytest.skip("a compiled module's functions cannot be patched")
    snapshot, config, now = case
    lazy = schedule(snapshot, config, now, seed)
    with patch.object(passes, "_any_usable", lambda groups, live: True):
        eager = schedule(snapshot, config, now, seed)
    assert lazy == eager
