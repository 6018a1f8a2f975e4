"""The store on PostgreSQL: statements run on asyncpg inside the transaction ``Database``
runs, rolled back on errors and cancels, events numbered in order, and plans that stay
index lookups."""

from __future__ import annotations

import asyncio

import pytest
from test_store_statements import _alloc, _job

from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import sql
from corral.server.store.db import Database, parse_db
from corral.server.store.tables import allocations, jobs, nodes

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def _open(url: str) -> Database:
    db = Database(parse_db(url))
    await db.prepare()
    return db


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


async def _generic_plan(db: Database, statement: str, arg: str) -> str:
    """The plan PostgreSQL caches for ``sql`` as a prepared statement (on this schema now)."""
    async with db.read() as conn:
        _, raw = sql.driver(conn)
        await raw.execute("SET plan_cache_mode = force_generic_plan")
        try:
            await raw.execute(f"PREPARE corral_plan({arg}) AS {statement}")
            rows = await raw.fetch("EXPLAIN EXECUTE corral_plan(NULL)")
            await raw.execute("DEALLOCATE corral_plan")
        finally:
            await raw.execute("RESET plan_cache_mode")
    return "\n".join(r[0] for r in rows)


async def test_rows_by_several_keys_are_index_lookups_on_a_fresh_schema(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        plans = {
            table.name: await _generic_plan(
                db, sql.Query(sql.rows_by_keys(table, column)).sql("postgresql"), "json"
            )
            for table, column in ((jobs, "id"), (allocations, "id"), (nodes, "name"))
        }
        async with db.write() as conn:
            await job_repo.insert_many(conn, [_job("a"), _job("b")])
        async with db.read() as conn:
            found = await job_repo.get_many(conn, ["b", "a", "b", "gone"])
    finally:
        await db.close()
    for name, plan in plans.items():
        assert f"Seq Scan on {name}" not in plan, plan
    assert sorted(found) == ["a", "b"]
