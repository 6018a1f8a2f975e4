"""The raw asyncpg path (``store.pgraw``) on PostgreSQL: same rows as SQLAlchemy, same
transaction, rolled back on errors and cancels, events numbered in order."""

from __future__ import annotations

import asyncio

import pytest
from test_rawsql import _alloc, _job, _read, _write_and_change

from corral.core.events import Event, EventKind
from corral.server.store import allocations as alloc_repo
from corral.server.store import events as event_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import pgraw
from corral.server.store.db import Database, parse_db
from corral.server.store.events import TeamEvent
from corral.server.store.tables import allocations, jobs, nodes

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def _open(url: str) -> Database:
    db = Database(parse_db(url))
    await db.prepare()
    return db


async def test_rows_written_by_either_path_read_the_same_by_either(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await _open(pg_url)
    try:
        async with db.read() as conn:
            assert pgraw.pg(conn) is not None, "a read hands the repos asyncpg"
        async with db.write() as conn:
            assert pgraw.pg(conn) is not None, "so does a write"
        async with db.engine.connect() as conn:
            assert pgraw.pg(conn) is None, "a connection SQLAlchemy runs keeps SQLAlchemy"
        await _write_and_change(db, 1)  # raw
        raw_read = await _read(db, 1)
        with monkeypatch.context() as m:
            m.setattr(pgraw, "pg", lambda conn: None)
            await _write_and_change(db, 2)  # SQLAlchemy, inside the transaction db runs
            sa_read_of_raw = await _read(db, 1)
            sa_read = await _read(db, 2)
        raw_read_of_sa = await _read(db, 2)
    finally:
        await db.close()
    assert raw_read == sa_read_of_raw
    assert sa_read == raw_read_of_sa


async def test_a_failed_write_leaves_nothing_and_its_connection_serves_on(pg_url: str) -> None:
    db = await _open(pg_url)
    try:

        async def fail_after_insert() -> None:
            async with db.write() as conn:
                await job_repo.insert(conn, _job("gone"))
                raise RuntimeError("after the insert")

        async def insert_twice() -> None:
            async with db.write() as conn:
                await job_repo.insert(conn, _job("twice"))
                await job_repo.insert(conn, _job("twice"))

        with pytest.raises(RuntimeError):
            await fail_after_insert()
        with pytest.raises(Exception, match="duplicate key"):
            await insert_twice()
        async with db.write() as conn:  # the pool's connections are usable, outside any tx
            await job_repo.insert(conn, _job("kept"))
        async with db.read() as conn:
            found = await job_repo.get_many(conn, ["gone", "twice", "kept"])
        assert set(found) == {"kept"}
    finally:
        await db.close()


async def test_a_write_cancelled_mid_transaction_commits_nothing(pg_url: str) -> None:
    db = await _open(pg_url)
    inserted = asyncio.Event()

    async def slow_write() -> None:
        async with db.write() as conn:
            await job_repo.insert(conn, _job("cancelled"))
            inserted.set()
            await conn.exec_driver_sql("SELECT pg_sleep(5)")

    try:
        task = asyncio.create_task(slow_write())
        await inserted.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with db.write() as conn:
            await job_repo.insert(conn, _job("after"))
        async with db.read() as conn:
            found = await job_repo.get_many(conn, ["cancelled", "after"])
        assert set(found) == {"after"}
    finally:
        await db.close()


async def test_events_appended_together_get_their_seqs_in_order(pg_url: str) -> None:
    db = await _open(pg_url)
    batch = [
        TeamEvent(Event(EventKind.JOB_LOG, float(i), f"j{i % 3}", None, {"i": i}), "t")
        for i in range(50)
    ]
    try:
        async with db.write() as conn:
            first = await event_repo.append(conn, batch[:1])
            seqs = await event_repo.append(conn, batch[1:])
        async with db.read() as conn:
            read = await event_repo.after(conn, 0, limit=100)
            of_j1 = await event_repo.after(conn, seqs[5], job_id="j1", team="t", limit=3)
    finally:
        await db.close()
    assert [*first, *seqs] == sorted({*first, *seqs}), "increasing, one each"
    assert [(e.seq, e.data["i"]) for e, _ in read] == [(s, i) for i, s in enumerate(first + seqs)]
    assert [e.data["i"] for e, _ in of_j1] == [7, 10, 13]


async def test_guarded_updates_stay_guarded_across_connections(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        async with db.write() as conn:
            await job_repo.insert(conn, _job("j"))
            await alloc_repo.insert(conn, _alloc("a", "j"))
        async with db.read() as conn:
            seen = await job_repo.get(conn, "j")
        assert seen is not None
        async with db.write() as conn:
            assert await job_repo.update(conn, seen, progress=0.5)
        async with db.write() as conn:
            assert not await job_repo.update(conn, seen, progress=0.9), "stale"
        async with db.read() as conn:
            now = await job_repo.get(conn, "j")
        assert now is not None
        assert (now.progress, now.version) == (0.5, seen.version + 1)
    finally:
        await db.close()


@pytest.mark.parametrize("path", ["asyncpg", "sqlalchemy"])
async def test_a_success_resets_the_failure_count_in_one_statement(
    pg_url: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "sqlalchemy":
        monkeypatch.setattr(pgraw, "pg", lambda conn: None)
    db = await _open(pg_url)
    try:
        async with db.write() as conn:
            await node_repo.insert(
                conn, name="n1", state="ready", inventory={}, joined_at=1.0, last_seen=1.0
            )
            await node_repo.insert(
                conn, name="n2", state="ready", inventory={}, joined_at=1.0, last_seen=1.0
            )
            n1 = await node_repo.get(conn, "n1")
            assert n1 is not None
            assert await node_repo.update(conn, n1, failure_streak=2)
        async with db.write() as conn:
            await node_repo.reset_streak(conn, "n1")
            await node_repo.reset_streak(conn, "n2")  # already 0: left alone
            await node_repo.reset_streak(conn, "gone")  # no such node: nothing
        async with db.read() as conn:
            after = {r.node.name: r for r in await node_repo.get_many(conn, ["n1", "n2"])}
    finally:
        await db.close()
    assert (after["n1"].failure_streak, after["n1"].version) == (0, 3)
    assert (after["n2"].failure_streak, after["n2"].version) == (0, 1)


async def test_an_allocation_read_spares_the_reset_of_a_healthy_node(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allocations.get`` reads its node's failure streak too: at 0, a success's reset sends
    nothing (nearly every end); above 0, or after a write to the node, it resets as before."""
    db = await _open(pg_url)
    sent: list[str] = []
    try:
        async with db.write() as conn:
            await node_repo.insert(
                conn, name="n1", state="ready", inventory={}, joined_at=1.0, last_seen=1.0
            )
            await job_repo.insert(conn, _job("j1"))
            await alloc_repo.insert(conn, _alloc("a1", "j1"))
        async with db.write() as conn:
            kind = type(pgraw.pg(conn))
            execute = kind.execute

            async def counted(self: object, sql: str, *args: object) -> object:
                sent.append(sql)
                return await execute(self, sql, *args)

            with monkeypatch.context() as patched:
                patched.setattr(kind, "execute", counted)
                assert await alloc_repo.get(conn, "a1") is not None
                await node_repo.reset_streak(conn, "n1")  # seen at 0: no statement
                assert not any("failure_streak" in q for q in sent)
                n1 = await node_repo.get(conn, "n1")
                assert n1 is not None
                assert await node_repo.update(conn, n1, failure_streak=2)  # forgets what it saw
                await node_repo.reset_streak(conn, "n1")
                assert sum("failure_streak = 0" in q for q in sent) == 1
        async with db.write() as conn:
            n1 = await node_repo.get(conn, "n1")
            assert n1 is not None
            assert await node_repo.update(conn, n1, failure_streak=3)
        async with db.write() as conn:
            assert await alloc_repo.get(conn, "a1") is not None  # sees 3
            await node_repo.reset_streak(conn, "n1")
        async with db.read() as conn:
            after = await node_repo.get(conn, "n1")
    finally:
        await db.close()
    assert after is not None
    assert after.failure_streak == 0


async def test_jobs_read_with_their_allocation_are_never_staler_than_the_transaction(
    pg_url: str,
) -> None:
    db = await _open(pg_url)
    try:
        async with db.write() as conn:
            await job_repo.insert(conn, _job("j"))
            await alloc_repo.insert(conn, _alloc("a", "j"))
        async with db.write() as conn:
            assert await alloc_repo.get(conn, "a") is not None
            assert set(pgraw.seen_jobs(conn)) == {"j"}, "read along with its allocation"
            ahead = await job_repo.get_many(conn, ["j"])
            assert not pgraw.seen_jobs(conn), "taken once"
            assert await job_repo.update(conn, ahead["j"], progress=0.25)
            await alloc_repo.get(conn, "a")
            assert await job_repo.update(conn, ahead["j"], progress=0.5) is False
            assert not pgraw.seen_jobs(conn), "a write to jobs forgets what was read ahead"
            now = await job_repo.get(conn, "j")
            assert now is not None
            assert (now.progress, now.version) == (0.25, ahead["j"].version + 1)
            savepoint = await conn.begin_nested()
            assert await job_repo.update(conn, now, progress=0.75)
            await alloc_repo.get(conn, "a")  # reads the savepoint's write
            await savepoint.rollback()
            assert not pgraw.seen_jobs(conn), "a rolled back savepoint forgets it too"
            back = await job_repo.get(conn, "j")
            assert back == now
        async with db.read() as conn:
            assert not pgraw.seen_jobs(conn), "each transaction or read starts afresh"
            final = await job_repo.get(conn, "j")
    finally:
        await db.close()
    assert final == now


async def test_a_write_cancelled_while_waiting_for_the_event_lock_leaves_a_clean_connection(
    pg_url: str,
) -> None:
    db = Database(parse_db(pg_url), pool_size=1)  # two connections: both get reused below
    await db.prepare()
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold_the_lock() -> None:
        async with db.write() as conn:
            await job_repo.insert(conn, _job("first"))
            holding.set()
            await release.wait()

    async def wait_for_the_lock() -> None:
        async with db.write() as conn:
            await job_repo.insert(conn, _job("never"))

    try:
        holder = asyncio.create_task(hold_the_lock())
        await holding.wait()
        waiter = asyncio.create_task(wait_for_the_lock())
        await asyncio.sleep(0.2)  # in BEGIN, queued behind the holder's lock
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await holder
        for n in range(4):  # each pooled connection serves reads and writes again
            async with db.read() as conn, db.read() as other:
                assert await job_repo.get(conn, "first") is not None
                assert await job_repo.get(other, "never") is None
            async with db.write() as conn:
                await job_repo.insert(conn, _job(f"after_{n}"))
        async with db.read() as conn:
            found = await job_repo.get_many(conn, ["never", *(f"after_{n}" for n in range(4))])
        assert set(found) == {f"after_{n}" for n in range(4)}
    finally:
        await db.close()


async def _generic_plan(db: Database, sql: str, arg: str = "varchar") -> str:
    """The plan PostgreSQL caches for ``sql`` as a prepared statement (on this schema now)."""
    async with db.read() as conn:
        raw = pgraw.pg(conn)
        await raw.execute("SET plan_cache_mode = force_generic_plan")
        try:
            await raw.execute(f"PREPARE corral_plan({arg}) AS {sql}")
            rows = await raw.fetch("EXPLAIN EXECUTE corral_plan(NULL)")
            await raw.execute("DEALLOCATE corral_plan")
        finally:
            await raw.execute("RESET plan_cache_mode")
    return "\n".join(r[0] for r in rows)


async def test_reading_an_allocation_with_its_jobs_never_scans_every_job(pg_url: str) -> None:
    """On a fresh schema (no statistics, small tables) too: the plan cached then is kept."""
    db = await _open(pg_url)
    try:
        plan = await _generic_plan(db, alloc_repo._PG_GET_WITH_JOBS)
    finally:
        await db.close()
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_id_key" in plan, plan


async def test_rows_by_several_keys_are_index_lookups_on_a_fresh_schema(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        plans = {
            table: await _generic_plan(
                db, pgraw.codec(table)._key_sql(column)[1], f"{pgraw.codec(table)._types[column]}[]"
            )
            for table, column in ((jobs, "id"), (allocations, "id"), (nodes, "name"))
        }
        async with db.write() as conn:
            await job_repo.insert_many(conn, [_job("a"), _job("b")])
        async with db.read() as conn:
            found = await job_repo.get_many(conn, ["b", "a", "b", "gone"])
    finally:
        await db.close()
    for table, plan in plans.items():
        assert f"Seq Scan on {table.name}" not in plan, plan
    assert sorted(found) == ["a", "b"]
