"""Order of service: classes by rank, users round robin (weighted), teams by borrowed share."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from live_queue_reference import ReferenceLiveQueue
from scheduler_builders import alloc, job, node, snapshot, team

from corral.core import Job
from corral.scheduler import Config, schedule
from corral.scheduler.fair import FairQueue
from corral.scheduler.lines import Line, lines_of
from corral.scheduler.need import Need, need_of
from corral.scheduler.ordering import Checks, LiveQueue
from corral.scheduler.passes import _take_least
from corral.scheduler.queues import IDLE_GROUPS, IDLE_LINES, Group, Queue
from corral.scheduler.service import with_served
from corral.scheduler.slots import Running


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


Splits = tuple[dict[str, dict[str, list[Group]]], dict[str, dict[Need, list[Group]]]]


def _splits(queue: Queue) -> Splits:
    """The groups of ``Queue.by_team`` and ``Queue.by_need`` as a rebuild from ``Queue.lists``
    has them, in the lists' order."""
    by_team: dict[str, dict[str, list[Group]]] = {}
    by_need: dict[str, dict[Need, list[Group]]] = {}
    for cls, groups in queue.lists.items():
        teams_of, needs_of = by_team.setdefault(cls, {}), by_need.setdefault(cls, {})
        for group in groups:
            teams_of.setdefault(group.team, []).append(group)
            needs_of.setdefault(group.need, []).append(group)
    return by_team, by_need


@given(queue_jobs(), st.lists(st.integers(0, 10_000), max_size=40))
def test_the_queue_keeps_its_splits_by_team_and_need_as_a_rebuild_has_them(
    jobs: list[Job], picks: list[int]
) -> None:
    """Jobs come and go in any order; the kept splits and users' lines always equal ones
    rebuilt from the lists, in the same order (a pass walks a team's groups in it),
    holding the same per-user lists."""
    queue = Queue(["paid", "batch"], big_gpus=8)
    waiting = list(jobs)
    for pick in picks:
        held = list(queue.jobs)
        if waiting and (not held or pick % 3):
            queue.add(waiting.pop(pick % len(waiting)))
        elif held:
            queue.remove(held[pick % len(held)])
        by_team, by_need = _splits(queue)
        assert {c: {t: list(own) for t, own in ts.items()} for c, ts in queue.by_team.items()} == (
            by_team
        )
        assert queue.by_need == by_need
        for cls, teams_of in queue.by_team.items():
            for own in teams_of.values():
                assert all(holders is queue.lists[cls][g] for g, holders in own.items())
            kept = {  # less the lines kept empty for their users' next jobs
                (team, user): (line.groups, line.firsts)
                for team, users in queue.lines[cls].items()
                for user, line in users.items()
                if line.groups
            }
            for users in queue.lines[cls].values():  # each place holds the queue's own list
                assert all(
                    place.jobs is queue.lists[cls][place.group][user]
                    and place.first is place.jobs[0]
                    for user, line in users.items()
                    for place in line.places
                )
            rebuilt = {
                (team, user): (line.groups, line.firsts)
                for team, own in teams_of.items()
                for user, line in lines_of(own).items()
            }
            assert kept == rebuilt


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


@given(
    live_queue_runs(),
    st.booleans(),
    st.dictionaries(st.sampled_from("uvwx"), st.sampled_from([0.25, 1.0, 2.5]), max_size=4),
)
def test_the_live_queue_hands_out_jobs_as_the_reference_model_does(
    run: tuple[dict[str, dict[str, list[Job]]], list[int]],
    by_team: bool,
    served: dict[str, float],
) -> None:
    """Pop for pop, the queue over kept lines agrees with the one that heaps every live
    group (the implementation before the sim2 round): groups die as the script says,
    jobs are decided, placed or not, with riders, and a refill revives groups. Users'
    recent service, given apart, counts as the reference's running work with it added
    (``with_served``). Over kept lines, the script runs twice: the second queue takes up
    the users' states the first one left on the lines (``Line.state``), and must start
    from nothing all the same."""
    groups, script = run
    weights = {"v": 2.0}
    running = {"w": 1.0}
    if by_team:  # two "teams": even and odd groups, each with its own lines
        halves = [{g: h for g, h in groups.items() if int(g[1:]) % 2 == k} for k in (0, 1)]
        lines = [lines_of(half) for half in halves]
        for _ in range(2):
            _run_live_queue(groups, weights, running, served, script, lines)
    else:
        _run_live_queue(groups, weights, running, served, script, None)


def _counted(value: float) -> Running:
    """A user's running work as the kept scheduler counts it."""
    kept = Running()
    kept.count = value
    return kept


def _run_live_queue(
    groups: dict[str, dict[str, list[Job]]],
    weights: dict[str, float],
    running: dict[str, float],
    served: dict[str, float],
    script: list[int],
    lines: list[dict[str, Line[str]]] | None,
) -> None:
    dead: set[str] = set()
    decided: set[str] = set()
    counts = {user: _counted(value) for user, value in running.items()}
    merged = with_served({"c": counts}, served, ["c"]).get("c", {})

    def live(g: str) -> bool:
        return g not in dead

    def usable(j: Job) -> bool:
        return j.id not in decided

    ours = LiveQueue(groups, weights, counts, Checks(live, usable), lines, served)
    reference = ReferenceLiveQueue(groups, weights, merged, live, usable)
    names = sorted(groups)
    every = [j for holders in groups.values() for own in holders.values() for j in own]
    for step in script:
        if step < 15:  # a group dies (only between refills may it come back)
            dead.add(names[step % len(names)])
        elif step < 25:  # capacity came back: everything lives again
            dead.clear()
            ours.refill()
            reference.refill()
            continue
        elif step < 30 and every:  # some job is decided elsewhere (a rider, another pass)
            decided.add(every[step % len(every)].id)
        want, got = reference.pop(), ours.pop()
        assert (got and got.id) == (want and want.id)
        if want is None or got is None:
            continue
        placed = step % 2 == 0
        riders = (every[step % len(every)],) if placed and step % 5 == 0 else ()
        if placed:
            decided.add(want.id)
        reference.done(want, placed, riders)
        ours.done(got, placed, riders)
    assert bool(ours) == bool(reference)


def test_a_queue_s_need_cache_never_mistakes_a_new_request_for_a_freed_one() -> None:
    # ``Queue.need`` finds a request by its id first; a request freed and another made in
    # its place (the same id, a different shape) must get its own need.
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
    # ``Queue._group`` finds a group by need, then bucket, then a scan of team, replicas and
    # CPU fallback: each part alone makes another group; an equal need (a new object, as a
    # node selector's need is) finds the same one.
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


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.booleans()), max_size=12))
def test_the_borrowing_pass_takes_teams_by_least_share_then_name(
    draws: list[tuple[float, bool]],
) -> None:
    # ``_take_least`` takes what ``heapq`` popped: the least (share, team) of those left,
    # each once, teams coming back (``append``) where they left a heap.
    shares = [(share, f"team-{i:02d}") for i, (share, _) in enumerate(draws)]
    left = list(shares)
    taken = []
    again = [f"team-{i:02d}" for i, (_, back) in enumerate(draws) if back]
    while left:
        expected = min(left)
        name = _take_least(left)
        assert name == expected[1]
        assert expected not in left
        assert len(left) == len(set(left))
        taken.append(name)
        if name in again:  # it placed a job and still has one: back in with a new share
            again.remove(name)
            left.append((expected[0] + 1.0, name))
    assert sorted(set(taken)) == sorted(t for _, t in shares)


def test_an_emptied_line_is_kept_for_the_user_s_next_job_without_its_pass_state() -> None:
    # A user's few queued jobs come and go: the line stays when its last job leaves, and the
    # user's next job takes it up again; a pass skips it while it is empty. The state a
    # pass left on it goes (its slots would hold on to lists and jobs long gone), and with
    # it the cycle the state and the line make.
    queue = Queue(["batch"])
    made = job("a").gpus(1).set(priority="batch", user="u").build()
    queue.add(made)
    users = queue.lines["batch"][made.team]
    line = users["u"]
    LiveQueue(queue.lists["batch"], {}, {}, Checks(lambda g: True, lambda j: True), [users])
    state = line.state
    assert state is not None
    assert state.lines == [line]
    queue.remove("a")
    assert users["u"] is line
    assert line.groups == []
    assert line.firsts == []
    assert line.state is None
    empty = LiveQueue(queue.lists["batch"], {}, {}, Checks(lambda g: True, lambda j: True), [users])
    assert empty.pop() is None
    assert line.state is None
    queue.add(job("b").gpus(1).set(priority="batch", user="u", submitted_at=5).build())
    assert users["u"] is line
    assert len(line.groups) == 1
    fair = LiveQueue(queue.lists["batch"], {}, {}, Checks(lambda g: True, lambda j: True), [users])
    handed = fair.pop()
    assert handed is not None
    assert handed.id == "b"
    assert line.state is not None


def test_empty_lines_past_the_bound_are_swept_holding_no_pass_state() -> None:
    # Kept empty lines are bounded: past IDLE_LINES more than the queued jobs, every empty
    # line goes. None of them holds a pass state (which refers back to its line: a cycle
    # reference counting alone would not free): each let go of it as it emptied.
    queue = Queue(["batch"])
    keeper = job("keep").gpus(1).set(priority="batch", user="k").build()
    queue.add(keeper)
    lines = []
    for n in range(IDLE_LINES + 1):
        made = job(f"j{n}").gpus(1).set(priority="batch", user=f"u{n}").build()
        queue.add(made)
        line = queue.lines["batch"][made.team][f"u{n}"]
        line.state = object()  # what a pass would leave on it
        lines.append(line)
        queue.remove(made.id)
    users = queue.lines["batch"][keeper.team]
    assert len(users) == IDLE_LINES + 2  # one more would pass the bound
    gone = job("last").gpus(1).set(priority="batch", user="last").build()
    queue.add(gone)
    queue.remove("last")
    assert list(users) == ["k"]  # the one line with a job stays
    assert all(line.state is None for line in lines)
    assert [j.id for j in queue.lists["batch"][queue.groups["keep"]]["k"]] == ["keep"]


def test_an_emptied_group_stays_for_its_next_job_and_past_the_bound_is_swept() -> None:
    # A group whose last job leaves keeps its (empty) place in its class's lists and both
    # splits, and its next job takes it up again; past IDLE_GROUPS more such groups than
    # queued jobs, every group with no job goes from the lists and the splits.
    queue = Queue(["batch"])
    keeper = job("keep").gpus(1).set(priority="batch", user="k").build()
    queue.add(keeper)
    groups, kept = queue.lists["batch"], queue.groups["keep"]
    first = job("a").gpus(2).set(priority="batch", user="u").build()
    queue.add(first)
    group = queue.groups["a"]
    queue.remove("a")
    assert groups[group] == {}, "kept, with no job"
    assert group in queue.by_team["batch"][first.team]
    assert group in queue.by_need["batch"][group.need]
    again = job("b").gpus(2).set(priority="batch", user="v", submitted_at=3).build()
    queue.add(again)
    assert queue.groups["b"] is group
    assert groups[group] == {"v": [again]}
    queue.remove("b")
    for n in range(IDLE_GROUPS + 1):  # each a group of its own (a team each)
        made = job(f"j{n}").gpus(3).set(priority="batch", team=f"t{n}").build()
        queue.add(made)
        queue.remove(made.id)
    assert list(groups) == [kept], "swept: only the group with a job is left"
    assert list(queue.by_team["batch"][keeper.team]) == [kept]
    assert queue.by_need["batch"] == {kept.need: [kept]}


def test_a_pass_reads_a_user_s_jobs_anew_after_the_queue_replaced_their_list() -> None:
    # The state a pass leaves on a user's line keeps its slots (a cursor over the user's
    # jobs of one group) for the next pass. Between passes, the user's last job of a group
    # may leave (the queue drops the list) and a new one come (a new list): the next pass
    # must read the new list, not the one its slot held.
    queue = Queue(["batch"])
    first = job("a").gpus(1).set(priority="batch", user="u", submitted_at=1).build()
    other = job("b").gpus(2).set(priority="batch", user="u", submitted_at=2).build()
    queue.add(first)
    queue.add(other)  # another group of the user's: the line stays when "a" leaves
    users = queue.lines["batch"][first.team]

    def one_pass() -> list[str]:
        gate: Checks[Group] = Checks(lambda g: True, lambda j: True)
        fair = LiveQueue(queue.lists["batch"], {}, {}, gate, [users])
        out = []
        while (handed := fair.pop()) is not None:
            out.append(handed.id)
            fair.done(handed, placed=True)
        return out

    assert one_pass() == ["a", "b"]
    queue.remove("a")
    queue.add(job("c").gpus(1).set(priority="batch", user="u", submitted_at=3).build())
    assert one_pass() == ["b", "c"]


def test_a_line_s_slots_start_afresh_for_the_next_queue_whoever_holds_the_line() -> None:
    # A line keeps its slots (Line.cursors) between passes; each queue's user state marks
    # its own. A user's second line joins the first line's state in a queue over every
    # team, and gets a state of its own in a queue over its team alone: the two states'
    # marks must differ, or the second queue would take up the first's cursor and skip
    # the job it handed out (and did not place).
    queue = Queue(["batch"])
    for name, team_name in (("a", "t1"), ("b", "t2")):
        queue.add(job(name).gpus(1).set(priority="batch", user="u", team=team_name).build())
    lines = queue.lines["batch"]
    every = [lines["t1"], lines["t2"]]
    gate: Checks[Group] = Checks(lambda g: True, lambda j: True)
    first = LiveQueue(queue.lists["batch"], {}, {}, gate, every)
    handed = []
    while (j := first.pop()) is not None:
        handed.append(j.id)
        first.done(j, placed=False)  # stays queued: its slot's cursor moved past it
    assert handed == ["a", "b"]
    assert lines["t2"]["u"].state is None  # joined the t1 line's state in that queue
    alone = LiveQueue(queue.lists["batch"], {}, {}, gate, [lines["t2"]])
    again = alone.pop()
    assert again is not None
    assert again.id == "b"
