"""Order of service: classes by rank, users round robin (weighted), teams by borrowed share."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot, team

from corral.core import Job
from corral.scheduler import Config, schedule
from corral.scheduler.fair import FairQueue
from corral.scheduler.groups import Group
from corral.scheduler.need import need_of
from corral.scheduler.ordering import Checks, LiveQueue
from corral.scheduler.queues import SWEEP_AFTER, Queue


def jobs_of(user: str, count: int, start: float = 0.0) -> list[Job]:
    return [
        job(f"{user}{i}").gpus(1).set(user=user, submitted_at=start + i).build()
        for i in range(count)
    ]


def test_round_robin_serves_every_user_before_anyone_twice() -> None:
    queue = FairQueue(jobs_of("a", 5) + jobs_of("b", 2, 100) + jobs_of("c", 1, 200), {}, {})
    order = [j.id for j in queue]
    assert order[:3] == ["a0", "b0", "c0"]
    assert order[3:5] == ["a1", "b1"]


def test_a_user_with_weight_two_gets_two_turns_per_round() -> None:
    queue = FairQueue(jobs_of("a", 6) + jobs_of("b", 6, 100), {"a": 2.0}, {})
    first_six = [j.user for j in list(queue)[:6]]
    assert first_six.count("a") == 4


def test_ties_go_to_the_user_with_less_running_work() -> None:
    queue = FairQueue(jobs_of("a", 2) + jobs_of("b", 2, 100), {}, {"a": 5})
    assert next(iter(queue)).user == "b"


def test_user_weights_come_from_the_config() -> None:
    jobs = (*jobs_of("a", 4), *jobs_of("b", 4, 100))
    snap = replace(snapshot([node("n").gpus(3)]), queued=jobs)
    plan = schedule(snap, Config(user_weights={"b": 2.0}))
    users = sorted(j[0] for p in plan.placements for j in p.job_ids)
    assert users == ["a", "b", "b"]


def test_borrowing_goes_first_to_the_team_that_borrows_least_per_weight() -> None:
    allocs = [alloc("a-old", "n").cards(0, 1).set(team="a", borrowed=True)]
    jobs = [
        job("a1").gpus(1).set(team="a", submitted_at=0),
        job("b1").gpus(1).set(team="b", submitted_at=5),
    ]
    plan = schedule(snapshot([node("n").gpus(3)], jobs, allocs, [team("a", 0), team("b", 0)]))
    assert [p.job_ids for p in plan.placements] == [("b1",)]


def test_within_quota_work_of_any_team_goes_before_anyone_borrows() -> None:
    jobs = [
        job("borrow").gpus(1).set(team="a", priority="interactive", submitted_at=0),
        job("owed").gpus(1).set(team="b", priority="batch", submitted_at=9),
    ]
    plan = schedule(snapshot([node("n").gpus(1)], jobs, teams=[team("a", 0), team("b", 1)]))
    assert [p.job_ids for p in plan.placements] == [("owed",)]
    assert not plan.placements[0].borrowed


def test_work_that_ends_together_shares_a_node() -> None:
    nodes = [node("soon").gpus(4), node("late").gpus(4)]
    allocs = [alloc("s", "soon").cards(0), alloc("l", "late").cards(0)]
    snap = snapshot(nodes, [job("long").gpus(1).set(estimated_runtime_s=4_800)], allocs)
    snap = replace(snap, expected_ends={"s": 200.0, "l": 5_000.0})
    plan = schedule(snap, now=100.0)
    assert plan.placements[0].node == "late"
    snap_short = replace(snap, queued=(job("short").gpus(1).set(estimated_runtime_s=100).build(),))
    assert schedule(snap_short, now=100.0).placements[0].node == "soon"


def test_jobs_that_cannot_run_now_do_not_use_their_users_turns() -> None:
    # a's two 4-GPU jobs cannot run (2 of 4 cards are busy); its 1-GPU job still gets
    # a turn in the first round, with b's first job: one card each.
    a = [job(f"a{i}").gpus(4).set(user="a", submitted_at=i) for i in range(2)]
    a.append(job("a2").gpus(1).set(user="a", submitted_at=2))
    b = [job(f"b{i}").gpus(1).set(user="b", submitted_at=10 + i) for i in range(3)]
    snap = snapshot([node("n").gpus(4)], [*a, *b], [alloc("busy", "n").cards(0, 1)])
    plan = schedule(snap, Config(reserve_min_gpus=None))
    assert sorted(j for p in plan.placements for j in p.job_ids) == ["a2", "b0"]


def test_the_live_queue_skips_dead_groups_whole_and_charges_only_placements() -> None:
    small = {"u": [job(f"u{i}").gpus(1).set(user="u").build() for i in range(3)]}
    big = {"u": [job("ubig").gpus(8).set(user="u", submitted_at=-1).build()]}
    other = {"v": [job(f"v{i}").gpus(1).set(user="v", submitted_at=i).build() for i in range(3)]}
    groups = {"small": small, "big": big, "other": other}
    dead = {"big"}
    queue = LiveQueue(groups, {}, {}, Checks(lambda g: g not in dead, lambda j: True))
    first = queue.pop()
    assert first is not None
    assert first.id == "u0"  # ubig is older, but its group is dead
    queue.done(first, placed=False)  # not placed: u keeps its turn
    second = queue.pop()
    assert second is not None
    assert second.id == "u1"
    queue.done(second, placed=True)  # placed: v goes next
    third = queue.pop()
    assert third is not None
    assert third.id == "v0"


@st.composite
def queue_jobs(draw: st.DrawFn) -> list[Job]:
    """Jobs of a few teams, users, classes and sizes (so groups share needs and teams)."""
    count = draw(st.integers(0, 24))
    return [
        job(f"j{i}")
        .gpus(draw(st.sampled_from([1, 2, 8])))
        .set(
            team=draw(st.sampled_from(["a", "b", "c"])),
            user=draw(st.sampled_from(["u", "v", "w"])),
            priority=draw(st.sampled_from(["paid", "batch", "unknown"])),
            submitted_at=draw(st.integers(0, 5)),
        )
        .build()
        for i in range(count)
    ]


def _key(group: Group) -> tuple[object, ...]:
    return (group.team, group.need, group.replicas, group.cpu, group.floor)


def _shape(queue: Queue) -> dict[str, object]:
    """What a queue holds per class: groups' jobs by user, the groups of each need, each
    user's groups in order with their first jobs, the big jobs and their teams."""
    out: dict[str, object] = {}
    for name, queued in queue.classes.items():
        out[name] = (
            {
                _key(g): {u: [j.id for j in own] for u, own in holders.items()}
                for g, holders in queued.groups.items()
                if holders  # emptied groups stay until a sweep
            },
            {
                need: {_key(g) for g in groups if queued.groups[g]}
                for need, groups in queued.by_need.items()
                if any(queued.groups[g] for g in groups)
            },
            {
                (team, user): ([_key(g) for g in own.groups], [j.id for j in own.firsts])
                for team, users in queued.users.items()
                for user, own in users.items()
                if own.cursors  # emptied ones stay until a sweep
            },
            [j.id for j in queued.big],
            queued.big_teams,
        )
    return out


@given(queue_jobs(), st.lists(st.integers(0, 10_000), max_size=40))
def test_a_queue_after_any_adds_and_removes_holds_what_a_fresh_one_would(
    jobs: list[Job], picks: list[int]
) -> None:
    """Jobs come and go in any order; the queue then holds exactly what a queue given only
    the jobs left holds, in the same order, and nothing for jobs gone."""
    queue = Queue(["paid", "batch"], big_gpus=8)
    waiting = list(jobs)
    for pick in picks:
        held = list(queue.jobs)
        if waiting and (not held or pick % 3):
            queue.add(waiting.pop(pick % len(waiting)))
        elif held:
            queue.remove(held[pick % len(held)])
        fresh = Queue(["paid", "batch"], big_gpus=8)
        for kept in queue.jobs.values():
            fresh.add(kept, sort=False)
        fresh.sort()
        assert _shape(queue) == _shape(fresh)
        assert (queue.unknown, queue.label_keys, queue.models) == (
            fresh.unknown,
            fresh.label_keys,
            fresh.models,
        )


@st.composite
def live_queue_runs(draw: st.DrawFn) -> tuple[dict[str, dict[str, list[Job]]], list[int]]:
    """Groups of jobs by user (each user's sorted), and a script of decisions."""
    groups: dict[str, dict[str, list[Job]]] = {}
    for g in range(draw(st.integers(1, 6))):
        holders: dict[str, list[Job]] = {}
        for user in draw(st.sets(st.sampled_from(["u", "v", "w", "x"]), max_size=4)):
            times = sorted(draw(st.lists(st.integers(0, 9), min_size=1, max_size=5)))
            holders[user] = sorted(
                (
                    job(f"{g}{user}{i}").gpus(1).set(user=user, submitted_at=t).build()
                    for i, t in enumerate(times)
                ),
                key=lambda j: (j.submitted_at, j.id),
            )
        groups[f"g{g}"] = holders
    return groups, draw(st.lists(st.integers(0, 99), max_size=60))


@given(live_queue_runs(), st.sets(st.sampled_from([f"g{i}" for i in range(6)])))
def test_the_live_queue_serves_users_in_turn_oldest_first_and_never_a_dead_group(
    run: tuple[dict[str, dict[str, list[Job]]], list[int]], dead: set[str]
) -> None:
    """Every job placed: each user's jobs come oldest first, no user gets a second turn
    before every user with a job left had one (equal weights, nothing running), jobs of
    dead groups never come, and every job of a live group comes exactly once."""
    groups, _ = run
    queue = LiveQueue(groups, {}, {}, Checks(lambda g: g not in dead, lambda j: True))
    handed: list[Job] = []
    while (got := queue.pop()) is not None:
        handed.append(got)
        queue.done(got, placed=True)
    live_jobs = {
        j.id for g, h in groups.items() if g not in dead for own in h.values() for j in own
    }
    assert sorted(j.id for j in handed) == sorted(live_jobs)
    by_user: dict[str, list[Job]] = {}
    for got in handed:
        by_user.setdefault(got.user, []).append(got)
    for own in by_user.values():
        assert own == sorted(own, key=lambda j: (j.submitted_at, j.id))
    served: dict[str, int] = dict.fromkeys(by_user, 0)
    for got in handed:
        left = [u for u in by_user if served[u] < len(by_user[u])]
        assert served[got.user] == min(served[u] for u in left)
        served[got.user] += 1


@given(live_queue_runs())
def test_each_job_is_offered_once_placed_or_not_and_a_refill_offers_the_rest(
    run: tuple[dict[str, dict[str, list[Job]]], list[int]],
) -> None:
    """Jobs decided as the script says (placed or not): no job is offered twice, even
    after a refill, and a refill offers every job not offered yet."""
    groups, script = run
    decided: set[str] = set()
    queue = LiveQueue(groups, {}, {}, Checks(lambda g: True, lambda j: j.id not in decided))
    offered: set[str] = set()
    for step in script:
        got = queue.pop()
        if got is None:
            break
        assert got.id not in offered, "offered twice without a refill"
        offered.add(got.id)
        placed = step % 2 == 0
        if placed:
            decided.add(got.id)
        queue.done(got, placed)
    queue.refill()
    again: set[str] = set()
    while (got := queue.pop()) is not None:
        again.add(got.id)
        decided.add(got.id)
        queue.done(got, placed=True)
    every = {j.id for h in groups.values() for own in h.values() for j in own}
    assert again == every - offered


@given(queue_jobs(), st.integers(1, 16))
def test_each_cycle_places_users_in_turn_and_each_user_s_oldest_first(
    jobs: list[Job], gpus: int
) -> None:
    """Through ``schedule``: one class and team, 1-GPU jobs of three users on one node:
    each user's placed jobs are its oldest, and no user is placed two more than one who
    still has a job queued."""
    same = [
        replace(j, priority="batch", team="a", resources=job("x").gpus(1).build().resources)
        for j in jobs
    ]
    snap = replace(snapshot([node("n").gpus(gpus)], teams=[team("a", gpus)]), queued=tuple(same))
    plan = schedule(snap)
    placed = {j for p in plan.placements for j in p.job_ids}
    by_user: dict[str, list[Job]] = {}
    for j in sorted(same, key=lambda j: (j.submitted_at, j.id)):
        by_user.setdefault(j.user, []).append(j)
    counts = {}
    for user, own in by_user.items():
        flags = [j.id in placed for j in own]
        assert flags == sorted(flags, reverse=True), f"{user}'s placed jobs are its oldest"
        counts[user] = sum(flags)
    waiting = [u for u, own in by_user.items() if counts[u] < len(own)]
    for user in waiting:
        assert max(counts.values()) <= counts[user] + 1


def test_a_queue_s_need_cache_never_mistakes_a_new_request_for_a_freed_one() -> None:
    # Requests freed and others made in their place (perhaps at the same address) each
    # get their own need; jobs sharing one request share its need.
    queue = Queue(["free"])
    for i in range(200):
        made = job(f"j{i}").gpus(1 + i % 7).build()
        assert queue.need(made) == need_of(made)
        del made  # freed: the next request may be allocated where this one was
    shared = job("s0").gpus(2).build()
    twin = replace(shared, id="s1")  # the same request object
    assert twin.resources is shared.resources
    assert queue.need(twin) is queue.need(shared)


def test_jobs_share_a_group_when_their_estimates_share_a_power_of_two() -> None:
    # ``Queue.add`` keys a group by the estimate's exponent; the group's floor is that
    # power of two (0 under a second, None without an estimate).
    queue = Queue(["batch"])
    estimates = {"a": 1.0, "b": 1.5, "c": 2.0, "d": 3.9, "e": 0.5, "f": None, "g": 4096.0}
    for name, estimate in estimates.items():
        made = job(name).gpus(1).set(priority="batch", estimated_runtime_s=estimate).build()
        queue.add(made)
    floors = {name: queue.groups[name].floor for name in estimates}
    assert floors == {"a": 1.0, "b": 1.0, "c": 2.0, "d": 2.0, "e": 0.0, "f": None, "g": 4096.0}
    assert queue.groups["a"] is queue.groups["b"]
    assert queue.groups["c"] is queue.groups["d"]
    assert len({id(g) for g in queue.groups.values()}) == 5


def test_jobs_share_a_group_only_when_team_need_replicas_fallback_and_bucket_agree() -> None:
    # Each of team, need, replicas, CPU fallback and estimate bucket alone makes another
    # group; an equal need (a new object, as a node selector's need is) finds the same one.
    queue = Queue(["batch"])

    def add(name: str, *, fallback: bool = False, **fields: object) -> Group:
        made = job(name).gpus(2).set(priority="batch", estimated_runtime_s=100.0, team="t")
        made = made.set(node_selector={"rack": "r1"}).set(**fields)
        built = (made.cpu_fallback() if fallback else made).build()
        queue.add(built)
        return queue.groups[built.id]

    base = add("base")
    assert add("same") is base
    others = [
        add("team", team="u"),
        add("need", node_selector={"rack": "r2"}),
        add("replicas", replicas=2),
        add("fallback", fallback=True),
        add("bucket", estimated_runtime_s=1000.0),
    ]
    assert len({id(g) for g in [base, *others]}) == 6
    assert [(g.team, g.replicas, g.cpu) for g in others] == [
        ("u", 1, False),
        ("t", 1, False),
        ("t", 2, False),
        ("t", 1, True),
        ("t", 1, False),
    ]
    assert add("team2", team="u") is others[0]


def test_a_queue_emptied_of_its_jobs_holds_nothing_for_them_after_a_sweep() -> None:
    queue = Queue(["batch"], big_gpus=8)
    for i in range(20):
        queue.add(
            job(f"j{i}")
            .gpus(1 + 7 * (i % 2))
            .set(priority="batch", user=f"u{i % 3}", team=f"t{i % 4}")
            .build()
        )
    for i in range(20):
        queue.remove(f"j{i}")
    queue.sweep()
    queued = queue.classes["batch"]
    assert (queued.groups, queued.by_need, queued.users, queued.big, queued.big_teams) == (
        {},
        {},
        {},
        [],
        {},
    )
    assert not queue.groups
    assert not queue.jobs


def test_removals_sweep_emptied_entries_on_their_own() -> None:
    queue = Queue(["batch"])
    for i in range(SWEEP_AFTER + 2):  # a team each: a group and a user's groups each
        queue.add(job(f"j{i}").gpus(1).set(priority="batch", team=f"t{i}").build())
        queue.remove(f"j{i}")
    queued = queue.classes["batch"]
    assert len(queued.groups) < SWEEP_AFTER
    assert len(queued.users) < SWEEP_AFTER


def test_a_pass_reads_a_user_s_jobs_anew_after_the_queue_replaced_their_list() -> None:
    # Between passes, the user's last job of a group may leave (the queue drops the list)
    # and a new one come (a new list): the next pass must read the new list.
    queue = Queue(["batch"])
    first = job("a").gpus(1).set(priority="batch", user="u", submitted_at=1).build()
    other = job("b").gpus(2).set(priority="batch", user="u", submitted_at=2).build()
    queue.add(first)
    queue.add(other)  # another group of the user's: the line stays when "a" leaves
    queued = queue.classes["batch"]

    def one_pass() -> list[str]:
        gate: Checks[Group] = Checks(lambda g: True, lambda j: True)
        fair = LiveQueue(queued.groups, {}, {}, gate, [queued.users[first.team]])
        out = []
        while (handed := fair.pop()) is not None:
            out.append(handed.id)
            fair.done(handed, placed=True)
        return out

    assert one_pass() == ["a", "b"]
    queue.remove("a")
    queue.add(job("c").gpus(1).set(priority="batch", user="u", submitted_at=3).build())
    assert one_pass() == ["b", "c"]


def test_the_next_queue_offers_a_job_an_earlier_queue_handed_out_and_did_not_place() -> None:
    # A user's groups in two teams: one queue over both teams, then one over the second
    # team alone; the second must offer the job the first handed out and did not place.
    queue = Queue(["batch"])
    for name, team_name in (("a", "t1"), ("b", "t2")):
        queue.add(job(name).gpus(1).set(priority="batch", user="u", team=team_name).build())
    queued = queue.classes["batch"]
    users = queued.users
    every = [users["t1"], users["t2"]]
    gate: Checks[Group] = Checks(lambda g: True, lambda j: True)
    first = LiveQueue(queued.groups, {}, {}, gate, every)
    handed = []
    while (j := first.pop()) is not None:
        handed.append(j.id)
        first.done(j, placed=False)  # stays queued: its slot's cursor moved past it
    assert handed == ["a", "b"]
    alone = LiveQueue(queued.groups, {}, {}, gate, [users["t2"]])
    again = alone.pop()
    assert again is not None
    assert again.id == "b"
