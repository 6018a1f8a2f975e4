"""Every statement of the store's public interface, run on SQLite and on PostgreSQL.

Each repo function is called through ``Database.write`` / ``Database.read`` (the
connections the server uses) and its answer checked; the same test runs on both
databases (``db_url``), so a statement that one of them reads differently fails here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from corral.core.events import Event, EventKind
from corral.core.model import Allocation, Job, Team
from corral.core.resources import ResourceRequest
from corral.core.states import AllocDesired, AllocObserved, JobState
from corral.server.store import allocations as alloc_repo
from corral.server.store import audit as audit_repo
from corral.server.store import events as event_repo
from corral.server.store import job_search, policies, retention, tokens, usage, versions
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.events import TeamEvent
from corral.server.store.job_search import JobFilter
from corral.server.store.records import AllocRecord, AttemptError, JobRecord, ResultFile

pytestmark = pytest.mark.anyio


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(parse_db(db_url))
    await database.prepare()
    try:
        yield database
    finally:
        await database.close()


def _job(job_id: str, *, team: str = "t", key: str | None = None) -> JobRecord:
    job = Job(
        id=job_id,
        resources=ResourceRequest(gpus=1, cpus=2),
        team=team,
        user="u",
        payload={"prompt": "a cat", "steps": 4},
        node_selector={"zone": "a"},
        timeout_s=30.0,
        submitted_at=100.0,
        idempotency_key=key,
    )
    return JobRecord(job=job, request_hash="h")


def _alloc(alloc_id: str, job_id: str, node: str = "n1") -> AllocRecord:
    alloc = Allocation(
        id=alloc_id,
        job_ids=(job_id,),
        node=node,
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


async def _node(db: Database, name: str, **values: object) -> None:
    async with db.write() as conn:
        await node_repo.insert(
            conn,
            name=name,
            state=values.pop("state", "ready"),
            inventory={"gpus": [], "cpus": 4},
            joined_at=1.0,
            last_seen=values.pop("last_seen", 1.0),
            **values,
        )


async def test_jobs_round_trip_every_column_kind(db: Database) -> None:
    files = [ResultFile("out", "k", 2, "text/plain", "s", b"ok").to_json()]
    errors = [AttemptError(1, "n1", "boom", 3.0).to_json()]
    async with db.write() as conn:
        await job_repo.insert(conn, _job("a"))
        await job_repo.insert_many(conn, [_job("b"), _job("c", key="k1")])
        a = await job_repo.get(conn, "a")
        assert a is not None
        assert await job_repo.update(
            conn, a, state=JobState.SUCCEEDED.value, result=files, attempt_errors=errors
        )
        assert not await job_repo.update(conn, a, error="stale"), "the version moved on"
        assert await job_repo.update(conn, replace(a, version=a.version + 1), interrupted=True)
    async with db.read() as conn:
        got = await job_repo.get(conn, "a")
        many = await job_repo.get_many(conn, ["c", "b", "c", "gone"])
        missing = await job_repo.get(conn, "gone")
        none = await job_repo.get_many(conn, [])
    assert got is not None
    assert (got.state, got.version, got.interrupted) == (JobState.SUCCEEDED, a.version + 2, True)
    assert got.result[0].inline == b"ok"
    assert got.attempt_errors[0].error == "boom"
    assert got.job.payload == {"prompt": "a cat", "steps": 4}
    assert got.job.node_selector == {"zone": "a"}
    assert sorted(many) == ["b", "c"]
    assert many["c"].job.idempotency_key == "k1"
    assert missing is None
    assert none == {}


async def test_job_lists_and_the_queue(db: Database) -> None:
    async with db.write() as conn:
        await job_repo.insert_many(
            conn, [_job(f"j{i}", team="x" if i % 2 else "y", key=f"k{i}") for i in range(5)]
        )
        j1 = await job_repo.get(conn, "j1")
        j2 = await job_repo.get(conn, "j2")
        assert j1 is not None
        assert j2 is not None
        moved = await job_repo.update_many(
            conn,
            [(j1, {"state": JobState.PLACED.value}), (replace(j2, version=9), {"state": "x"})],
        )
    assert moved == {"j1"}, "the stale one is left alone"
    async with db.read() as conn:
        keyed = await job_repo.by_idempotency_keys(conn, "x", ["k1", "k3", "k2"])
        newest = await job_search.page(conn, JobFilter(), before_seq=None, limit=2)
        older = await job_search.page(conn, JobFilter(), before_seq=newest[-1].seq, limit=10)
        queued_y = JobFilter(team="y", states=[JobState.QUEUED])
        team_y = await job_search.page(conn, queued_y, before_seq=None, limit=50)
        after = await job_repo.after_seq(conn, newest[-1].seq, 10)
        teams = await job_repo.queued_teams(conn)
        queued = await job_repo.queued_versions(conn)
        latest_queued = await job_repo.newest_ids(conn, JobState.QUEUED, 3)
        latest_placed = await job_repo.newest_ids(conn, JobState.PLACED, 3)
    assert sorted(keyed) == ["k1", "k3"], "another team's key is not this team's"
    assert [r.job.id for r in newest] == ["j4", "j3"]
    assert [r.job.id for r in older] == ["j2", "j1", "j0"]
    assert [r.job.id for r in team_y] == ["j4", "j2", "j0"]
    assert [r.job.id for r in after] == ["j4"]
    assert teams == [("j0", "y"), ("j2", "y"), ("j3", "x"), ("j4", "y")]
    assert queued == [("j0", 1), ("j2", 1), ("j3", 1), ("j4", 1)]
    assert latest_queued == ["j4", "j3", "j2"], "newest first, at most the limit"
    assert latest_placed == ["j1"]


async def test_allocations(db: Database) -> None:
    async with db.write() as conn:
        await job_repo.insert_many(conn, [_job("j1"), _job("j2")])
        await alloc_repo.insert(conn, _alloc("a1", "j1"))
        await alloc_repo.insert_many(conn, [_alloc("a2", "j2", "n2"), _alloc("a3", "j2")])
        a3 = await alloc_repo.get(conn, "a3")
        assert a3 is not None
        assert await alloc_repo.update(conn, a3, active=False, stop_reason=None)
        assert not await alloc_repo.update(conn, a3, active=True), "stale"
    async with db.read() as conn:
        a1 = await alloc_repo.get(conn, "a1")
        assert a1 is not None
        hinted = await alloc_repo.get(conn, "a1", hint=a1)
        stale_hint = await alloc_repo.get(conn, "a3", hint=a3)
        every = await alloc_repo.active(conn)
        on_n2 = await alloc_repo.active(conn, node="n2")
        versions_ = await alloc_repo.active_versions(conn)
        many = await alloc_repo.get_many(conn, ["a3", "a1", "gone"])
    assert a1.alloc.gpu_indices == (0, 1)
    assert a1.alloc.desired is AllocDesired.RUN
    assert hinted is a1, "the same version: the record this server wrote"
    assert stale_hint is not None
    assert stale_hint.version == a3.version + 1, "a moved row is read again"
    assert [a.alloc.id for a in every] == ["a1", "a2"]
    assert [a.alloc.id for a in on_n2] == ["a2"]
    assert versions_ == {"a1": 1, "a2": 1}
    assert sorted(a.alloc.id for a in many) == ["a1", "a3"]


async def test_nodes_and_teams(db: Database) -> None:
    await _node(db, "n1", token_id="tok", state="lost", last_seen=5.0)
    await _node(db, "n2", token_id="tok", state="lost", last_seen=3.0)
    await _node(db, "n3")
    async with db.write() as conn:
        n1 = await node_repo.get(conn, "n1")
        assert n1 is not None
        assert await node_repo.update(conn, n1, failure_streak=2)
        await node_repo.reset_streak(conn, "n1")
        await node_repo.reset_streak(conn, "n3")  # already 0: left alone
        await node_repo.reset_streak(conn, "gone")
        assert await node_repo.touch(conn, "n3", 9.0)
        assert not await node_repo.touch(conn, "n3", 8.0), "last_seen only moves forward"
        assert await node_repo.delete(conn, "n2")
        assert not await node_repo.delete(conn, "n2")
        await node_repo.put_team(conn, Team("b", 4.0, None, 2.0), 1.0)
        await node_repo.put_team(conn, Team("b", 6.0, 1.5, 1.0), 2.0)  # replaced
        await node_repo.ensure_teams(conn, {"a", "b"}, 3.0)
    await _node(db, "n2", token_id="tok", state="lost", last_seen=3.0)
    async with db.read() as conn:
        every = await node_repo.all_nodes(conn)
        many = await node_repo.get_many(conn, ["n3", "n1", "gone"])
        node_versions = await node_repo.versions(conn)
        held = await node_repo.held_by_token(conn, "tok")
        lost = await node_repo.lost_of_token(conn, "tok", 5)
        teams = await node_repo.all_teams(conn)
        b = await node_repo.get_team(conn, "b")
        nobody = await node_repo.get_team(conn, "nobody")
        schedulable = await node_repo.schedulable(conn, "n3")
    assert [n.node.name for n in every] == ["n1", "n2", "n3"]
    assert sorted(n.node.name for n in many) == ["n1", "n3"]
    by_name = {n.node.name: n for n in every}
    assert (by_name["n1"].failure_streak, by_name["n1"].version) == (0, 3)
    assert (by_name["n3"].version, by_name["n3"].node.last_seen) == (1, 9.0)
    assert node_versions == {"n1": 3, "n2": 1, "n3": 1}
    assert held == 2
    assert lost == ["n2", "n1"], "the longest silent first"
    assert teams == [Team("a", 0.0, None, 1.0), Team("b", 6.0, 1.5, 1.0)]
    assert b == Team("b", 6.0, 1.5, 1.0)
    assert nobody is None
    assert schedulable


async def test_events_append_in_order_and_page_by_filter(db: Database) -> None:
    batch = [
        TeamEvent(Event(EventKind.JOB_LOG, float(i), f"j{i % 3}", None, {"i": i}), "t")
        for i in range(150)  # more than one statement's worth (APPEND_ROWS)
    ]
    async with db.write() as conn:
        first = await event_repo.append(conn, batch[:1], jump=1000)
        seqs = await event_repo.append(conn, batch[1:])
        nothing = await event_repo.append(conn, [])
    async with db.read() as conn:
        read = await event_repo.after(conn, 0, limit=500)
        of_j1 = await event_repo.after(conn, seqs[5], job_id="j1", team="t", limit=3)
        of_team = await event_repo.after(conn, 0, team="other")
        last = await event_repo.last_seq(conn)
    assert first[0] >= 1000, "numbered past the highest on disk"
    assert [*first, *seqs] == sorted({*first, *seqs}), "increasing, one each"
    assert nothing == []
    assert [(e.seq, e.data["i"]) for e, _ in read] == [(s, i) for i, s in enumerate(first + seqs)]
    assert [e.data["i"] for e, _ in of_j1] == [7, 10, 13]
    assert of_team == []
    assert last == seqs[-1]


async def test_versions_read_what_a_cycle_starts_from(db: Database) -> None:
    await _node(db, "n1")
    async with db.write() as conn:
        await job_repo.insert_many(conn, [_job("j2"), _job("j1"), _job("j3")])
        await alloc_repo.insert(conn, _alloc("a1", "j1"))
        j3 = await job_repo.get(conn, "j3")
        assert j3 is not None
        assert await job_repo.update(conn, j3, state=JobState.PLACED.value)
        await node_repo.put_team(conn, Team("b-team", 4.0, None, 2.0), 1.0)
        await node_repo.put_team(conn, Team("a-team", 8.0, 2.5, 1.0), 1.0)
    async with db.read() as conn:
        seen = await versions.read(conn)
        without = await versions.read(conn, with_queued=False)
    assert seen.queued == [("j2", 1), ("j1", 1)], "in submission order"
    assert seen.active == {"a1": 1}
    assert seen.nodes == {"n1": 1}
    assert seen.teams == [Team("a-team", 8.0, 2.5, 1.0), Team("b-team", 4.0, None, 2.0)]
    assert without.queued == []


async def test_policy_versions(db: Database) -> None:
    async with db.read() as conn:
        assert await policies.latest_version(conn) == 0, "none applied: the built-in one"
    async with db.write() as conn:
        for version in (1, 2):
            entry = policies.PolicyVersion(version, f"v{version}", "admin", float(version))
            await policies.insert(conn, entry)
    async with db.read() as conn:
        assert await policies.latest_version(conn) == 2


async def test_tokens(db: Database) -> None:
    async with db.write() as conn:
        for n, kind in enumerate(("admin", "admin", "client")):
            await tokens.insert(
                conn, id=f"t{n}", name=f"n{n}", kind=kind, hash=f"h{n}", created_at=float(n)
            )
    async with db.write() as conn:
        assert await tokens.has_admin(conn)
        assert (await tokens.by_hash(conn, "h2")).id == "t2"
        assert await tokens.by_hash(conn, "nope") is None
        assert [t.id for t in await tokens.listing(conn)] == ["t0", "t1", "t2"]
        assert await tokens.revoke(conn, "t2", 5.0)
        assert not await tokens.revoke(conn, "t2", 6.0), "once"
        assert await tokens.revoked_among(conn, ["t0", "t2", "gone"]) == ["gone", "t2"]
        assert await tokens.revoke_admins(conn, "t0", 7.0) == ["t1"]
        assert await tokens.has_admin(conn), "the one kept"


async def test_audit(db: Database) -> None:
    async with db.write() as conn:
        for n, action in enumerate(("job.submit", "job.cancel", "token.create")):
            await audit_repo.append(
                conn,
                at=float(n),
                actor_id="a",
                actor_kind="token",
                actor_name="alice",
                actor_team="t",
                action=action,
                target=f"x{n}",
                detail={"n": n},
            )
    async with db.write() as conn:
        jobs_only = await audit_repo.page(
            conn, audit_repo.AuditFilter(actions=("job.*",)), None, 10
        )
        by_name = await audit_repo.page(conn, audit_repo.AuditFilter(actor="alice"), None, 1)
        gone = await audit_repo.delete_before(conn, 1.5, 10)
        left = await audit_repo.page(conn, audit_repo.AuditFilter(), None, 10)
    assert [r.action for r in jobs_only] == ["job.cancel", "job.submit"]
    assert [r.target for r in by_name] == ["x2"]
    assert gone == 2
    assert [r.detail for r in left] == [{"n": 2}]


async def test_usage_and_retention(db: Database) -> None:
    files = [ResultFile("o", "k", 300, "text/plain", "s").to_json()]
    async with db.write() as conn:
        await job_repo.insert_many(conn, [_job("done"), _job("waits")])
        done = await job_repo.get(conn, "done")
        assert done is not None
        assert await job_repo.update(
            conn, done, state=JobState.SUCCEEDED.value, finished_at=50.0, result=files * 2
        )
        await event_repo.append(
            conn,
            [
                TeamEvent(Event(EventKind.JOB_PROGRESS, 1.0, "done", None, {}), "t"),
                TeamEvent(Event(EventKind.JOB_LOG, 1.0, "done", None, {}), "t"),
                TeamEvent(Event(EventKind.NODE_JOINED, 1.0, None, "n1", {}), None),
            ],
        )
    async with db.write() as conn:
        queued = await usage.queued_jobs(conn, "t")
        count, last, size = await usage.result_bytes_page(conn, "t", 0)
        window = await retention.window(conn, 0, 10)
        ages = await retention.ages(conn, ["done", "gone"])
        detail = await retention.delete_detail(conn, ["done"])
        unattached = await retention.delete_unattached_events(conn, 2.0, 10)
        expired = [a for a in window if a.ended_before(60.0)]
        deleted = await retention.delete_jobs(conn, expired)
        left = await job_repo.get_many(conn, ["done", "waits"])
    assert queued == 1
    assert (count, size) == (2, 600)
    assert last == window[-1].seq
    assert [a.id for a in window] == ["done", "waits"]
    assert [a.id for a in ages] == ["done"]
    assert (detail, unattached) == (1, 1)
    assert deleted == (1, 1), "the job and its one event left"
    assert list(left) == ["waits"]


@pytest.mark.postgres
async def test_a_connection_the_store_does_not_run_is_refused(pg_url: str) -> None:
    from corral.server.store.sql import NotRunByStore

    db = Database(parse_db(pg_url))
    await db.prepare()
    try:
        async with db.engine.connect() as conn:
            with pytest.raises(NotRunByStore):
                await job_repo.get(conn, "j")
    finally:
        await db.close()
