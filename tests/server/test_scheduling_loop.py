"""The scheduling shell: triggers, the derived snapshot cache, leadership."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from server_harness import ADMIN, World
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.states import JobState
from corral.server.loops import schedule as schedule_loop
from corral.server.loops.leader import LEADER_LOCK, AdvisoryLockLeader
from corral.server.store import nodes as node_repo
from corral.server.store.db import Database, lock_key, parse_db

pytestmark = pytest.mark.anyio


async def test_changes_trigger_a_cycle(world: World) -> None:
    trigger = world.plane.rt.schedule_needed
    trigger.clear()
    await world.submit()
    assert trigger.fired
    trigger.clear()
    await world.agent("n1")
    assert trigger.fired


async def test_the_snapshot_cache_decodes_only_what_changed(world: World) -> None:
    jobs = [await world.submit(resources={"gpus": 4}) for _ in range(5)]
    world.plane.rt.fresh_jobs.clear()  # without the submissions' hints (see below)
    await world.cycle()
    cache = world.plane.schedule.cache
    assert cache.rows_read == 5
    await world.cycle()
    assert cache.rows_read == 0, "an unchanged store must cost no row decoding"

    await world.plane.jobs.cancel(ADMIN, jobs[0].job.id)
    await world.agent("n1", gpus=8)
    await world.cycle()
    assert cache.rows_read == 1  # the node; the cancelled job just leaves the snapshot
    placed = {a.jobs[0].job_id for a in world.link.sent.assigned}
    assert len(placed) == 2
    assert jobs[0].job.id not in placed
    await world.cycle()
    assert len(cache.jobs) == 2, "placed jobs leave the cached queue"
    assert cache.rows_read == 0, "the placed allocations come from the placement itself"
    assert len(cache.allocations) == 2


async def test_only_one_replica_leads(pg_url: str) -> None:
    a, b = Database(parse_db(pg_url)), Database(parse_db(pg_url))
    key = lock_key(LEADER_LOCK, a.target.schema)  # per schema: parallel test runs never meet
    first, second = AdvisoryLockLeader(a.engine, key), AdvisoryLockLeader(b.engine, key)
    try:
        assert await first.acquire()
        assert not await second.acquire()
        assert await first.acquire(), "the leader keeps leading"
        await first.release()
        assert await second.acquire()
    finally:
        await first.release()
        await second.release()
        await a.close()
        await b.close()


async def test_a_leader_whose_connection_broke_stops_leading_and_another_takes_over(
    pg_url: str,
) -> None:
    a, b = Database(parse_db(pg_url)), Database(parse_db(pg_url))
    key = lock_key(LEADER_LOCK, a.target.schema)
    first, second = AdvisoryLockLeader(a.engine, key), AdvisoryLockLeader(b.engine, key)
    try:
        assert await first.acquire()
        assert first._conn is not None
        raw = (await first._conn.get_raw_connection()).driver_connection
        pid = raw.get_server_pid()
        async with b.engine.connect() as admin:  # PostgreSQL ends the leader's session
            # ... and waits (up to 10 s) until it has ended: the lock goes when the
            # backend exits, a moment after the signal (a slow machine lost the race).
            ended = await admin.execute(
                sa.text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}
            )
            assert ended.scalar() is True
            await admin.commit()
        assert await second.acquire(), "the session lock went with the session"
        assert not await first.acquire(), "the old leader notices at its next check"
    finally:
        await first.release()
        await second.release()
        await a.close()
        await b.close()


async def test_submitted_jobs_reach_the_snapshot_without_a_row_read(world: World) -> None:
    jobs = [await world.submit(resources={"gpus": 1}) for _ in range(3)]
    fresh = world.plane.rt.fresh_jobs
    assert set(fresh) == {j.job.id for j in jobs}
    # A hint the version read does not confirm is not taken: the row is read.
    fresh[jobs[2].job.id] = replace(jobs[2], version=jobs[2].version + 1, progress=0.5)
    async with world.plane.rt.db.read() as conn:
        snapshot, seen = await world.plane.schedule.cache.load(conn, fresh)
    assert world.plane.schedule.cache.rows_read == 1
    assert fresh == {}, "the hints are taken once"
    assert [j.id for j in snapshot.queued] == [j.job.id for j in jobs]
    assert seen[jobs[2].job.id].version == jobs[2].version
    assert seen[jobs[2].job.id].progress == 0.0
    agent = await world.agent("n1", gpus=3)
    await world.cycle()
    placed = {(await agent.next_assignment()).jobs[0].job_id for _ in range(3)}
    assert placed == {j.job.id for j in jobs}


async def test_a_hint_for_a_job_that_moved_on_is_not_placed(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    await world.plane.jobs.cancel(ADMIN, job.job.id)
    world.plane.rt.fresh_jobs[job.job.id] = job  # as if the cancellation had not been seen
    await world.agent("n1")
    await world.cycle()
    assert world.link.sent.assigned == []


async def test_running_allocations_carry_their_expected_end(world: World) -> None:
    await world.submit(resources={"gpus": 1}, estimated_runtime_s=100)
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a = await agent.next_assignment()
    started_at = world.clock.now()
    await agent.start(a)
    async with world.plane.rt.db.read() as conn:
        snapshot, _ = await world.plane.schedule.cache.load(conn)
    assert dict(snapshot.expected_ends) == {a.allocation_id: started_at + 100}
    await agent.finish(a)
    async with world.plane.rt.db.read() as conn:
        snapshot, _ = await world.plane.schedule.cache.load(conn)
    assert dict(snapshot.expected_ends) == {}


async def test_the_kept_read_connection_never_holds_the_wal_back(tmp_path: Path) -> None:
    db_file = tmp_path / "w.db"
    world = await World.open(f"sqlite:///{db_file}", tmp_path)
    loop = world.plane.schedule

    async def sizes(conn: AsyncConnection) -> dict[str, int]:  # a read through SQLAlchemy
        await conn.execute(sa.text("SELECT count(*) FROM jobs"))
        return {}

    loop.model_sizes = sizes
    try:
        await world.agent("n1", gpus=2)
        for _ in range(3):
            await world.submit(resources={"gpus": 1})
            await world.cycle()
        assert loop._reader is not None, "cycles keep one read connection"
        assert not loop._reader.in_transaction(), "... with no read transaction between cycles"
        # A full checkpoint succeeds only if no reader still sees an old snapshot.
        with contextlib.closing(sqlite3.connect(db_file)) as other:
            busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        assert (db_file.parent / "w.db-wal").stat().st_size == 0
    finally:
        await world.close()
    assert world.plane.schedule._reader is None, "stopping gives it back"


async def test_queue_and_node_gauges_follow_the_cycles(world: World) -> None:
    def gauges() -> dict[str, float]:
        text = world.plane.rt.metrics.render().decode()
        wanted = ("corral_queue_depth{", "corral_nodes{")
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(wanted)
        }

    await world.submit(resources={"gpus": 1}, team="vision")
    await world.submit(resources={"gpus": 1}, team="vision")
    await world.cycle()
    seen = gauges()
    assert seen['corral_queue_depth{priority="free",team="vision"}'] == 2
    assert seen['corral_nodes{state="ready"}'] == 0
    await world.cycle()
    assert gauges() == seen, "an unchanged cycle leaves them as they were"
    await world.agent("n1", gpus=1)
    await world.cycle()
    seen = gauges()
    assert seen['corral_queue_depth{priority="free",team="vision"}'] == 1  # one was placed
    assert seen['corral_nodes{state="ready"}'] == 1


async def test_an_end_pokes_the_scheduler_only_when_work_waits(world: World) -> None:
    trigger = world.plane.rt.schedule_needed
    agent = await world.agent("n1", gpus=1)
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    a = await agent.next_assignment()
    assert not world.plane.rt.work_waiting, "everything was placed"
    trigger.clear()
    await agent.start(a)
    await agent.finish(a)
    assert not trigger.fired, "nothing waits for the freed GPU: no cycle for it"

    await world.submit(resources={"gpus": 1})
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    b = await agent.next_assignment()
    assert world.plane.rt.work_waiting, "one job did not fit"
    trigger.clear()
    await agent.start(b)
    await agent.finish(b)
    assert trigger.fired, "the waiting job may fit now"

    await world.cycle()
    c = await agent.next_assignment()
    assert not world.plane.rt.work_waiting
    trigger.clear()
    await agent.start(c)
    await agent.fail(c, retryable=True)
    assert trigger.fired, "a requeued job is work waiting"
    await world.cycle()
    requeued = await world.plane.jobs.get(ADMIN, c.jobs[0].job_id)
    still_queued = requeued.state is JobState.QUEUED  # waiting out its retry backoff
    assert world.plane.rt.work_waiting is still_queued


# -- a lone submission to a quiet server is placed in its own transaction ------------------


async def _quiet(world: World) -> None:
    """A leading loop whose last cycle left nothing waiting (what ``run`` would reach)."""
    world.plane.schedule.leading = True
    await world.cycle()
    assert not world.plane.rt.work_waiting
    world.plane.rt.schedule_needed.clear()


async def test_a_lone_submission_to_a_quiet_server_is_placed_in_its_own_transaction(
    world: World,
) -> None:
    await world.agent("n1", gpus=1)
    await _quiet(world)
    cycles = world.plane.schedule.cycles
    rec = await world.submit(resources={"gpus": 1})
    job = await world.job(rec.job.id)
    assert job.state is JobState.PLACED, "placed before the submission returned"
    assert world.plane.schedule.cycles == cycles + 1
    assert [a.jobs[0].job_id for a in world.link.sent.assigned] == [rec.job.id]
    assert not world.plane.rt.schedule_needed.fired, "no second cycle for what is placed"
    events = await world.events(rec.job.id)
    assert [e.kind.value for e in events] == ["job.submitted", "job.placed"]
    assert events[0].at == events[1].at, "one transaction: one time for both"


async def _left_to_the_loop(world: World) -> None:
    """A submission that stays queued, pokes the loop, and is placed by the loop's cycle."""
    rec = await world.submit(resources={"gpus": 1})
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    assert world.plane.rt.schedule_needed.fired
    await world.cycle()
    assert (await world.job(rec.job.id)).state is JobState.PLACED


async def _after_a_burst(world: World) -> None:
    """A leading loop whose last cycle placed two jobs (a burst) and left nothing waiting."""
    await world.agent("n1", gpus=8)
    # Not leading yet: each waits for the loop's cycle, which then finds two jobs.
    recs = [await world.submit(resources={"gpus": 1}) for _ in range(2)]
    await _quiet(world)
    for rec in recs:
        assert (await world.job(rec.job.id)).state is JobState.PLACED


async def test_submissions_gathered_in_one_group_are_placed_in_its_transaction(
    world: World,
) -> None:
    """Submissions that queued while the last group committed are a burst already gathered:
    their group runs the cycle in its own transaction, even right after another burst."""
    await _after_a_burst(world)
    await asyncio.sleep(max(0.0, world.plane.schedule.pause_s()))  # the loop's pacing
    writes = world.plane.jobs.group
    cycles, groups = world.plane.schedule.cycles, writes.groups

    recs = await asyncio.gather(*(world.submit(resources={"gpus": 1}) for _ in range(3)))

    assert writes.groups - groups == 1, "the three submissions committed together"
    assert world.plane.schedule.cycles == cycles + 1, "one cycle, inside that commit"
    assert not world.plane.rt.schedule_needed.fired, "no second cycle for what is placed"
    ids = sorted(r.job.id for r in recs)
    assert sorted(a.jobs[0].job_id for a in world.link.sent.assigned[-3:]) == ids
    for rec in recs:
        assert (await world.job(rec.job.id)).state is JobState.PLACED
        events = await world.events(rec.job.id)
        assert [e.kind.value for e in events] == ["job.submitted", "job.placed"]
        assert events[0].at == events[1].at, "one transaction: one time for both"


async def test_a_group_within_the_loop_s_pacing_is_left_to_the_loop(
    db_url: str, tmp_path: Path
) -> None:
    """A stream of small groups is scheduled at the loop's pace, not a cycle per group."""
    world = await World.open(db_url, tmp_path, debounce_s=60.0)
    try:
        await _after_a_burst(world)
        assert world.plane.schedule.pause_s() > 50, "a burst: cycles 60 s apart"
        cycles = world.plane.schedule.cycles
        recs = await asyncio.gather(*(world.submit(resources={"gpus": 1}) for _ in range(3)))
        assert world.plane.schedule.cycles == cycles
        for rec in recs:
            assert (await world.job(rec.job.id)).state is JobState.QUEUED
        assert world.plane.rt.schedule_needed.fired, "the loop schedules them at its pace"
    finally:
        await world.close()


async def test_a_lone_submission_right_after_a_burst_is_left_to_the_loop(world: World) -> None:
    """The loop's debounce gathers a burst that arrives one by one into one cycle."""
    await _after_a_burst(world)
    await _left_to_the_loop(world)


class _Deposed:
    """Leadership that was lost: the lock's connection says another replica has it."""

    leads = False

    async def acquire(self) -> bool:
        return self.leads

    async def release(self) -> None:
        return None


@pytest.mark.postgres
async def test_a_replica_that_lost_the_lead_places_nothing_in_a_submission(
    pg_world: World,
) -> None:
    """On PostgreSQL the leadership is confirmed beside the snapshot's read: a replica whose
    lock is gone (it still believed it led) leaves the job to whoever leads now."""
    world = pg_world
    await world.agent("n1", gpus=1)
    await _quiet(world)
    world.plane.schedule.leader = _Deposed()
    rec = await world.submit(resources={"gpus": 1})
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    assert await world.kinds(rec.job.id) == ["job.submitted"]
    assert world.link.sent.assigned == []
    assert not world.plane.schedule.leading
    assert world.plane.rt.schedule_needed.fired, "the loop forwards it to the leader"


class _Hung:
    """A lock connection that never answers (a silently dropped TCP connection)."""

    async def acquire(self) -> bool:
        await asyncio.Event().wait()
        return True

    async def release(self) -> None:
        return None


@pytest.mark.postgres
async def test_a_lock_connection_that_hangs_holds_a_submission_back_briefly_only(
    pg_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission's own cycle holds the event-ordering lock while it asks whether it
    still leads: an answer that does not come counts as no, after ``LEAD_CONFIRM_S``."""
    world = pg_world
    monkeypatch.setattr(schedule_loop, "LEAD_CONFIRM_S", 0.05)
    await world.agent("n1", gpus=1)
    await _quiet(world)
    world.plane.schedule.leader = _Hung()
    rec = await asyncio.wait_for(world.submit(resources={"gpus": 1}), 5)
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    assert not world.plane.schedule.leading, "the loop asks again, holding nothing"


@pytest.mark.postgres
async def test_a_cycle_confirms_the_lead_beside_its_snapshot_and_places_nothing_without(
    pg_world: World,
) -> None:
    world = pg_world
    await world.agent("n1", gpus=1)
    await _quiet(world)
    loop = world.plane.schedule
    loop.leader = leader = _Deposed()
    rec = await world.submit(resources={"gpus": 1})  # not placed in the submission either
    loop.leading = True  # what the loop believed until it asked
    applied = await loop.cycle(confirm=True)
    assert applied.placed == []
    assert not loop.leading
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    leader.leads = True
    loop.leading = True
    applied = await loop.cycle(confirm=True)
    assert [a.jobs[0].job_id for a in applied.placed] == [rec.job.id]
    assert loop.leading


async def test_a_submission_s_own_cycle_takes_its_nodes_from_its_snapshot(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in the same transaction, the snapshot's nodes say which take work: the
    placement does not ask the store again (the loop's own cycle, read apart, does)."""
    asked: list[str] = []
    schedulable = node_repo.schedulable

    async def counted(conn: object, name: str) -> bool:
        asked.append(name)
        return await schedulable(conn, name)  # type: ignore[arg-type]

    monkeypatch.setattr(node_repo, "schedulable", counted)
    await world.agent("n1", gpus=2)
    await _quiet(world)
    rec = await world.submit(resources={"gpus": 1})
    assert (await world.job(rec.job.id)).state is JobState.PLACED
    assert asked == []
    world.plane.rt.work_waiting = True  # not quiet: the loop's path
    other = await world.submit(resources={"gpus": 1})
    await world.cycle()
    assert (await world.job(other.job.id)).state is JobState.PLACED
    assert asked == ["n1"]


async def test_place_on_submit_off_leaves_it_to_the_loop(db_url: str, tmp_path: Path) -> None:
    world = await World.open(db_url, tmp_path, place_on_submit=False)
    try:
        await world.agent("n1", gpus=1)
        await _quiet(world)
        await _left_to_the_loop(world)
    finally:
        await world.close()


async def test_work_already_waiting_takes_the_loop_path(world: World) -> None:
    await world.agent("n1", gpus=1)
    await _quiet(world)
    big = await world.submit(resources={"gpus": 4})  # fits nowhere: the loop keeps it waiting
    await world.cycle()
    assert world.plane.rt.work_waiting
    world.plane.rt.schedule_needed.clear()
    await _left_to_the_loop(world)
    assert (await world.job(big.job.id)).state is JobState.QUEUED


@pytest.mark.parametrize("where", ["schedule", "after-writes"])
async def test_a_cycle_failing_inside_a_submission_leaves_the_submission_standing(
    where: str, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """On both databases; ``after-writes`` fails once the placement's rows and events are
    written in the submission's transaction, so the savepoint has something to undo."""
    await world.agent("n1", gpus=1)
    await _quiet(world)
    loop = world.plane.schedule

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("scheduler bug")

    name = "schedule" if where == "schedule" else "_remember"  # _remember runs after apply
    kept = getattr(loop, name)
    setattr(loop, name, broken)
    rec = await world.submit(resources={"gpus": 1})
    assert "scheduling inside a submission failed" in caplog.text
    job = await world.job(rec.job.id)
    assert job.state is JobState.QUEUED, "accepted all the same"
    assert job.allocation_ids == ()
    assert await world.kinds(rec.job.id) == ["job.submitted"]
    assert world.plane.rt.schedule_needed.fired, "the loop is told to schedule it"
    assert world.link.sent.assigned == []
    setattr(loop, name, kept)
    await world.cycle()
    assert (await world.job(rec.job.id)).state is JobState.PLACED
    assert [a.jobs[0].job_id for a in world.link.sent.assigned] == [rec.job.id]
