"""The store: --db parsing, migrations on both databases, guarded updates, event order."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.core.errors import InvalidSpec
from corral.core.events import Event, EventKind
from corral.core.model import Job
from corral.server.store import events as event_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.events import TeamEvent
from corral.server.store.records import JobRecord, job_row

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("given", "want_driver", "want_schema"),
    [
        ("/tmp/x.db", "sqlite+aiosqlite", None),
        ("sqlite:////tmp/x.db", "sqlite+aiosqlite", None),
        ("postgresql://u@h:5432/d", "postgresql+asyncpg", None),
        ("postgres://u@h/d?schema=s1", "postgresql+asyncpg", "s1"),
    ],
    ids=["bare-path", "sqlite-url", "postgresql", "postgres-with-schema"],
)
def test_db_urls_map_to_async_drivers(
    given: str, want_driver: str, want_schema: str | None
) -> None:
    target = parse_db(given)
    assert (target.url.drivername, target.schema) == (want_driver, want_schema)
    assert "schema" not in str(target.url)


@pytest.mark.parametrize(
    "bad", ["mysql://h/d", "postgresql://h/d?schema=a;drop"], ids=["mysql", "schema-injection"]
)
def test_bad_db_urls_name_the_field(bad: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        parse_db(bad)
    assert err.value.field == "db"


def _head() -> str:
    from alembic.script import ScriptDirectory

    from corral.server.store.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def _db(db_url: str) -> Database:
    db = Database(parse_db(db_url))
    await db.prepare()
    return db


async def test_migrations_create_every_table_and_are_idempotent(db_url: str) -> None:
    db = await _db(db_url)
    try:
        await db.prepare()  # a second start migrates nothing and breaks nothing
        async with db.read() as conn:
            names = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
            version = (
                await conn.execute(sa.text("SELECT version_num FROM alembic_version"))
            ).scalar()
        assert {"jobs", "allocations", "nodes", "teams", "tokens", "events", "audit"} <= names
        assert version == _head()
    finally:
        await db.close()


async def test_guarded_update_refuses_a_stale_version(db_url: str) -> None:
    db = await _db(db_url)
    try:
        rec = JobRecord(job=Job(id="j1"))
        async with db.write() as conn:
            await job_repo.insert(conn, rec)
        async with db.write() as conn:
            fresh = await job_repo.get(conn, "j1")
            assert fresh is not None
            assert await job_repo.update(conn, fresh, progress=0.5)
            assert not await job_repo.update(conn, fresh, progress=0.9)  # same old version
        async with db.read() as conn:
            final = await job_repo.get(conn, "j1")
        assert final is not None
        assert (final.progress, final.version) == (0.5, 2)
    finally:
        await db.close()


async def test_a_node_s_flags_alone_say_whether_it_takes_work(db_url: str) -> None:
    db = await _db(db_url)
    flags = {
        "ready": ("ready", False, False),
        "paused": ("ready", True, False),
        "draining": ("ready", False, True),
        "lost": ("lost", False, False),
    }
    try:
        async with db.write() as conn:
            for name, (state, paused, draining) in flags.items():
                await node_repo.insert(
                    conn,
                    name=name,
                    state=state,
                    paused=paused,
                    draining=draining,
                    inventory={"gpus": [], "cpus": 4},
                    joined_at=1.0,
                    last_seen=1.0,
                )
        for reading in (db.write, db.read):  # inside a transaction and outside one
            async with reading() as conn:
                full = {n: await node_repo.get(conn, n) for n in flags}
                said = {n: await node_repo.schedulable(conn, n) for n in [*flags, "nowhere"]}
            assert said == {n: r is not None and r.node.schedulable for n, r in full.items()} | {
                "nowhere": False
            }
            assert [n for n, ok in said.items() if ok] == ["ready"]
    finally:
        await db.close()


async def test_a_failed_transaction_leaves_nothing(db_url: str) -> None:
    db = await _db(db_url)
    try:

        async def crash_mid_way() -> None:
            async with db.write() as conn:
                await job_repo.insert(conn, JobRecord(job=Job(id="j1")))
                raise RuntimeError("crash mid-way")

        with pytest.raises(RuntimeError):
            await crash_mid_way()
        async with db.read() as conn:
            assert await job_repo.get(conn, "j1") is None
    finally:
        await db.close()


async def test_events_come_back_in_order_filtered_by_job_and_team(db_url: str) -> None:
    db = await _db(db_url)
    try:
        async with db.write() as conn:
            await event_repo.append(
                conn,
                [
                    TeamEvent(Event(EventKind.JOB_SUBMITTED, 1.0, "a"), "t1"),
                    TeamEvent(Event(EventKind.JOB_SUBMITTED, 2.0, "b"), "t2"),
                    TeamEvent(
                        Event(EventKind.JOB_PROGRESS, 3.0, "a", data={"progress": 0.5}), "t1"
                    ),
                ],
            )
        async with db.read() as conn:
            all_events = await event_repo.after(conn, 0)
            of_a = await event_repo.after(conn, 0, job_id="a")
            of_t2 = await event_repo.after(conn, 0, team="t2")
            resumed = await event_repo.after(conn, all_events[0][0].seq)
        seqs = [e.seq for e, _ in all_events]
        assert seqs == sorted(seqs)
        assert len(seqs) == 3
        assert [e.kind for e, _ in of_a] == [EventKind.JOB_SUBMITTED, EventKind.JOB_PROGRESS]
        assert of_a[1][0].data == {"progress": 0.5}
        assert [e.job_id for e, _ in of_t2] == ["b"]
        assert [e.job_id for e, _ in resumed] == ["b", "a"]
    finally:
        await db.close()


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    import anyio

    async def check() -> str:
        db = await _db(str(tmp_path / "wal.db"))
        try:
            async with db.read() as conn:
                return str((await conn.execute(sa.text("PRAGMA journal_mode"))).scalar())
        finally:
            await db.close()

    assert anyio.run(check) == "wal"


def _insert_as_of_the_schema(c: sa.Connection, rec: JobRecord) -> None:
    """Insert ``rec`` with the columns the jobs table has now (an older revision's)."""
    table = sa.Table("jobs", sa.MetaData(), autoload_with=c)
    row = {k: v for k, v in job_row(rec).items() if k in table.c}
    c.execute(sa.insert(table).values(**row))


async def test_an_older_schema_is_upgraded_in_place_keeping_its_rows(db_url: str) -> None:
    from alembic import command

    from corral.server.store.migrate import alembic_config

    db = Database(parse_db(db_url))
    try:
        await db.prepare()  # creates the schema (and the PostgreSQL schema) at head ...
        async with db.write() as conn:  # ... then go back to the first revision
            await conn.run_sync(lambda c: command.downgrade(alembic_config(c), "0001"))
            await conn.run_sync(_insert_as_of_the_schema, JobRecord(job=Job(id="old")))
        await db.prepare()
        async with db.read() as conn:
            cols = await conn.run_sync(
                lambda c: {col["name"] for col in sa.inspect(c).get_columns("allocations")}
            )
            assert "expected_end_at" in cols
            assert await job_repo.get(conn, "old") is not None
    finally:
        await db.close()


async def test_migration_0022_copies_each_job_s_model_into_its_column(db_url: str) -> None:
    from alembic import command

    from corral.server.store import job_search
    from corral.server.store.job_search import JobFilter
    from corral.server.store.migrate import alembic_config

    db = Database(parse_db(db_url))
    try:
        await db.prepare()
        async with db.write() as conn:
            await conn.run_sync(lambda c: command.downgrade(alembic_config(c), "0015"))
            for job in (Job(id="a", model="sdxl-base"), Job(id="b")):
                await conn.run_sync(_insert_as_of_the_schema, JobRecord(job=job))
        await db.prepare()
        async with db.read() as conn:
            found = await job_search.page(
                conn, JobFilter(model="sdxl-base"), before_seq=None, limit=10
            )
            assert [r.job.id for r in found] == ["a"]
    finally:
        await db.close()
