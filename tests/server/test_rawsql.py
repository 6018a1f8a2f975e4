"""The raw sqlite3 path (``store.rawsql``) and SQLAlchemy read and write the same rows alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from corral.core.events import Event, EventKind
from corral.core.model import Allocation, Job
from corral.core.resources import ResourceRequest
from corral.core.states import AllocDesired, AllocObserved, JobState
from corral.server.store import allocations as alloc_repo
from corral.server.store import events as event_repo
from corral.server.store import guard, rawsql
from corral.server.store import jobs as job_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.events import TeamEvent
from corral.server.store.records import AllocRecord, AttemptError, JobRecord, ResultFile

pytestmark = pytest.mark.anyio

REPOS = (job_repo, alloc_repo, event_repo, guard)


def _job(job_id: str) -> JobRecord:
    job = Job(
        id=job_id,
        resources=ResourceRequest(gpus=1, cpus=2),
        team="t",
        user="u",
        payload={"prompt": "a cat", "steps": 4},
        node_selector={"zone": "a"},
        timeout_s=30.0,
        submitted_at=100.0,
    )
    return JobRecord(job=job, request_hash="h")


def _alloc(alloc_id: str, job_id: str) -> AllocRecord:
    alloc = Allocation(
        id=alloc_id,
        job_ids=(job_id,),
        node="n1",
        team="t",
        user="u",
        priority="batch",
        gpu_indices=(0, 1),
        cpus=2,
        on_cpu=False,
        preemptible=True,
        attempt=1,
        desired=AllocDesired.RUN,
        observed=AllocObserved.PENDING,
    )
    return AllocRecord(alloc=alloc, created_at=101.0)


def _sqlalchemy_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for repo in REPOS:
        monkeypatch.setattr(repo, "driver", lambda conn: None)


async def _write_and_change(db: Database, n: int) -> None:
    """Insert a job and an allocation, then change JSON, boolean and nullable columns."""
    async with db.write() as conn:
        await job_repo.insert_many(conn, [_job(f"job_{n}")])
        await alloc_repo.insert(conn, _alloc(f"al_{n}", f"job_{n}"))
        rec = await job_repo.get(conn, f"job_{n}")
        assert rec is not None
        files = [ResultFile("out", "k", 2, "text/plain", "s", b"ok").to_json()]
        errors = [AttemptError(1, "n1", "boom", 3.0).to_json()]
        assert await job_repo.update(
            conn, rec, state=JobState.SUCCEEDED.value, result=files, attempt_errors=errors
        )
        assert not await job_repo.update(conn, rec, error="stale"), "the version moved on"
        alloc = await alloc_repo.get(conn, f"al_{n}")
        assert alloc is not None
        assert await alloc_repo.update(conn, alloc, active=False, stop_reason=None)
        await event_repo.append(
            conn, [TeamEvent(Event(EventKind.JOB_LOG, 5.0, f"job_{n}", None, {"a": [1]}), "t")]
        )


async def _read(db: Database, n: int) -> tuple[object, ...]:
    async with db.read() as conn:
        job = await job_repo.get(conn, f"job_{n}")
        many = await job_repo.get_many(conn, [f"job_{n}"])
        alloc = await alloc_repo.get(conn, f"al_{n}")
        active = await alloc_repo.active(conn, node="n1")
        events = await event_repo.after(conn, 0, job_id=f"job_{n}")
    assert job is not None
    assert alloc is not None
    job = replace(job, seq=0)  # each database numbers its own rows
    many = {k: replace(v, seq=0) for k, v in many.items()}
    events = [(replace(e, seq=0), team) for e, team in events]
    return job, many, alloc, active, events


async def test_rows_written_by_either_path_read_the_same_by_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(parse_db(str(tmp_path / "r.db")))
    await db.prepare()
    try:
        async with db.read() as conn:
            assert rawsql.driver(conn) is not None, "SQLite runs inline here"
        await _write_and_change(db, 1)  # raw
        raw_read = await _read(db, 1)
        with monkeypatch.context() as m:
            _sqlalchemy_only(m)
            await _write_and_change(db, 2)  # SQLAlchemy
            sa_read_of_raw = await _read(db, 1)
            sa_read = await _read(db, 2)
        raw_read_of_sa = await _read(db, 2)
    finally:
        await db.close()
    assert raw_read == sa_read_of_raw
    assert sa_read == raw_read_of_sa
    job = raw_read[0]
    assert isinstance(job, JobRecord)
    assert job.result[0].inline == b"ok"
    assert job.attempt_errors[0].error == "boom"
    assert job.job.payload == {"prompt": "a cat", "steps": 4}


@pytest.mark.postgres
async def test_the_driver_is_sqlites_own_connection_and_only_while_one_is_open(
    tmp_path: Path, pg_url: str
) -> None:
    db = Database(parse_db(str(tmp_path / "d.db")))
    await db.prepare()
    try:
        async with db.read() as conn:
            raw = rawsql.driver(conn)
            assert raw is not None
            assert raw.execute("SELECT 1").fetchone() == (1,)
            async with db.read() as other:  # each connection its own
                assert rawsql.driver(other) not in (None, raw)
        assert rawsql.driver(conn) is None  # given back to the pool
    finally:
        await db.close()
    pg = Database(parse_db(pg_url))
    await pg.prepare()
    try:
        async with pg.read() as conn:
            assert rawsql.driver(conn) is None
    finally:
        await pg.close()
