"""The scheduling shell: triggers, the change feed that keeps the scheduler in step, leadership."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from server_harness import ADMIN, World
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.states import JobState
from corral.server.loops.leader import LEADER_LOCK, AdvisoryLockLeader
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


async def test_the_feed_decodes_only_what_changed(world: World) -> None:
    jobs = [await world.submit(resources={"gpus": 4}) for _ in range(5)]
    await world.cycle()
    feed = world.plane.schedule.kept.feed
    assert feed.rows_read == 5
    await world.cycle()
    assert feed.rows_read == 0, "an unchanged store must cost no row decoding"

    await world.plane.jobs.cancel(ADMIN, jobs[0].job.id)
    await world.agent("n1", gpus=8)
    await world.cycle()
    assert feed.rows_read == 1  # the node; the cancelled job is just withdrawn
    placed = {a.jobs[0].job_id for a in world.link.sent.assigned}
    assert len(placed) == 2
    assert jobs[0].job.id not in placed
    await world.cycle()
    assert len(feed.jobs) == 2, "placed jobs are withdrawn"
    assert feed.rows_read == 0, "the placed allocations come from the placement itself"
    assert len(feed.allocations) == 2
    held = await world.plane.schedule.snapshot()
    # the jobs neither cancelled nor placed (all five were submitted at one instant: which
    # two are placed first is the scheduler's tie-break, not this test's concern)
    waiting = {j.job.id for j in jobs[1:]} - placed
    assert sorted(j.id for j in held.queued) == sorted(waiting)


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
        async with b.engine.connect() as admin:  # PostgreSQL ends the leader's session
            # the session holding the lock (a bigint key: its high and low halves)
            held = await admin.execute(
                sa.text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND classid = :hi AND objid = :lo AND objsubid = 1"
                ),
                {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
            )
            pid = held.scalar_one()
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


async def test_a_job_cancelled_before_the_cycle_is_not_placed(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    await world.cycle()  # told to the kept scheduler
    await world.plane.jobs.cancel(ADMIN, job.job.id)
    await world.agent("n1")
    await world.cycle()
    assert world.link.sent.assigned == []


async def test_a_requeued_job_is_submitted_again_as_it_is_now(world: World) -> None:
    """Placed, then lost with its node: the feed withdraws it, then submits it again with its
    next attempt, and another node takes it."""
    job = await world.submit(resources={"gpus": 1})
    first = await world.agent("n1")
    await world.cycle()
    await first.next_assignment()
    assert (await world.tick(after=31)).lost_nodes == ["n1"]
    assert (await world.job(job.job.id)).state is JobState.QUEUED
    second = await world.agent("n2")
    await world.cycle()
    a = await second.next_assignment()
    assert a.jobs[0].job_id == job.job.id
    assert a.attempt == 2


async def test_running_allocations_carry_their_expected_end(world: World) -> None:
    await world.submit(resources={"gpus": 1}, estimated_runtime_s=100)
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a = await agent.next_assignment()
    started_at = world.clock.now()
    await agent.start(a)
    snapshot = await world.plane.schedule.snapshot()
    assert dict(snapshot.expected_ends) == {a.allocation_id: started_at + 100}
    await agent.finish(a)
    snapshot = await world.plane.schedule.snapshot()
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
        # A full checkpoint succeeds only if no reader still sees an old snapshot: the
        # cycles' kept read connection holds no read transaction between cycles.
        with contextlib.closing(sqlite3.connect(db_file)) as other:
            busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        assert (db_file.parent / "w.db-wal").stat().st_size == 0
    finally:
        await world.close()


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


# -- a submission commits alone; the loop places it ------------------------------------------


async def test_a_submission_to_a_quiet_server_is_placed_by_the_next_cycle(world: World) -> None:
    """The submission's transaction only inserts: the loop's cycle, woken at its commit,
    places it in a transaction of its own."""
    await world.agent("n1", gpus=1)
    world.plane.schedule.leading = True
    await world.cycle()
    assert not world.plane.rt.work_waiting
    world.plane.rt.schedule_needed.clear()
    rec = await world.submit(resources={"gpus": 1})
    assert (await world.job(rec.job.id)).state is JobState.QUEUED
    assert world.plane.rt.schedule_needed.fired
    await world.cycle()
    assert (await world.job(rec.job.id)).state is JobState.PLACED
    assert [a.jobs[0].job_id for a in world.link.sent.assigned] == [rec.job.id]


class _Deposed:
    """Leadership that was lost: the lock's connection says another replica has it."""

    leads = False

    async def acquire(self) -> bool:
        return self.leads

    async def release(self) -> None:
        return None


@pytest.mark.postgres
async def test_a_cycle_confirms_the_lead_beside_its_catch_up_and_places_nothing_without(
    pg_world: World,
) -> None:
    world = pg_world
    await world.agent("n1", gpus=1)
    loop = world.plane.schedule
    loop.leader = leader = _Deposed()
    rec = await world.submit(resources={"gpus": 1})
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
