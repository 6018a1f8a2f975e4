"""Does the jobs list stay fast with 100,000 jobs in the database?

    python bench/job_list.py [--jobs 100000] [--small 1000] [--postgres URL] [--repeat 5]
    (e.g. --postgres postgresql://postgres@127.0.0.1:5432/test)

Fills a fresh SQLite file (and a fresh PostgreSQL schema with ``--postgres``) with jobs
shaped like a busy cluster's history (mostly finished samples, 8 teams, 200 users, a few
models, 100 nodes, a month of submissions), written straight through the store, then
times the dashboard's list queries (``store/job_search.py``: newest first, 50 a page,
filtered) at ``--small`` jobs and again at ``--jobs``. Each line is the median of
``--repeat`` runs, then the ratio of the big table's time to the small one's (1.0x:
the page costs the same however many jobs there are)::

    sqlite   100,000 jobs  newest page                    0.9 ms   1.1x
    sqlite   100,000 jobs  page 1,000 (cursor)            0.9 ms   1.0x
    ...
    sqlite   slowest at 100,000: user nobody (no match)  2.1 ms
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pg_schema import drop_schema_of

from corral.core.model import Job, JobKind
from corral.core.states import JobState
from corral.server.store import job_search
from corral.server.store.db import Database, parse_db
from corral.server.store.job_search import JobFilter
from corral.server.store.records import JobRecord, job_row
from corral.server.store.sql import insert_rows
from corral.server.store.tables import jobs

PAGE = 50  # the dashboard's page
CHUNK = 2000  # rows per insert statement
TEAMS = [f"team{i}" for i in range(8)]
USERS = 200
NODES = 100
MONTH_S = 30 * 86400
# (state, share): a long-running cluster's table is mostly history
STATES = [
    (JobState.SUCCEEDED, 0.90),
    (JobState.FAILED, 0.04),
    (JobState.CANCELLED, 0.02),
    (JobState.QUEUED, 0.02),
    (JobState.RUNNING, 0.01),
    (JobState.PLACED, 0.01),
]
MODELS = [("sdxl-base", 0.5), ("flux-dev", 0.3), ("sd15", 0.199), ("rare-lora", 0.001)]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    where: Callable[[int], JobFilter]  # from the table's size
    deep: bool = False  # start from the middle of the table (a cursor)


CASES = [
    Case("newest page", lambda n: JobFilter()),
    Case("page n/2 (cursor)", lambda n: JobFilter(), deep=True),
    Case("state queued", lambda n: JobFilter(states=(JobState.QUEUED,))),
    Case("state running+placed", lambda n: JobFilter(states=(JobState.RUNNING, JobState.PLACED))),
    Case("team team3", lambda n: JobFilter(team="team3")),
    Case("team team3, page n/2", lambda n: JobFilter(team="team3"), deep=True),
    Case("user u17", lambda n: JobFilter(user="u17")),
    Case("kind train", lambda n: JobFilter(kind="train")),
    Case("model flux-dev", lambda n: JobFilter(model="flux-dev")),
    Case("model rare-lora", lambda n: JobFilter(model="rare-lora")),
    Case("node n42", lambda n: JobFilter(node="n42")),
    Case("priority paid", lambda n: JobFilter(priority="paid")),
    Case("submitted last hour", lambda n: JobFilter(since=_END - 3600)),
    Case("id prefix", lambda n: JobFilter(id_prefix="job_00000")),
    Case("team3 + user u3 + failed", lambda n: JobFilter((JobState.FAILED,), "team3", "u3")),
    Case("user nobody (no match)", lambda n: JobFilter(user="nobody")),
    Case("model absent (no match)", lambda n: JobFilter(model="absent")),
    Case("node absent (no match)", lambda n: JobFilter(node="absent")),
]  # fmt: skip
_END = 1.8e9  # the newest job's submission time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000, help="the big table")
    p.add_argument("--small", type=int, default=1_000, help="the table it is compared with")
    p.add_argument("--postgres", help="also on this PostgreSQL (a fresh schema in it)")
    p.add_argument("--schema", default="bench_job_list", help="the PostgreSQL schema it drops")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        targets = [("sqlite", f"sqlite:///{tmp}/jobs.db")]
        if a.postgres:
            targets.append(("postgres", _with_schema(a.postgres, a.schema)))
        for label, url in targets:
            drop_schema_of(url)  # each run starts empty (a SQLite path names no schema)
            try:
                asyncio.run(run(label, url, a.small, a.jobs, a.repeat))
            finally:
                drop_schema_of(url)
    return 0


async def run(label: str, url: str, small: int, big: int, repeat: int) -> None:
    """Fill to ``small``, time every case, fill to ``big``, time again; print each."""
    db = Database(parse_db(url), sqlite_synchronous="OFF", wal_prefill=False)
    try:
        await db.prepare()
        rng = random.Random(7)
        t0 = time.perf_counter()
        await fill(db, 0, small, big, rng)
        before = {c.name: await timed(db, c, small, repeat) for c in CASES}
        await fill(db, small, big, big, rng)
        if db.is_postgres:  # as autovacuum would have by now on a server that took them
            async with db.read() as conn:
                await conn.execute(sa.text("ANALYZE jobs"))
        fill_s = time.perf_counter() - t0
        print(f"{label:8} filled {big:,} jobs in {fill_s:.1f} s", flush=True)
        after: dict[str, float] = {}
        for c in CASES:
            after[c.name] = await timed(db, c, big, repeat)
            ratio = after[c.name] / before[c.name] if before[c.name] else float("inf")
            print(
                f"{label:8} {big:>7,} jobs  {c.name:30} {after[c.name]:7.1f} ms  {ratio:5.1f}x",
                flush=True,
            )
        worst = max(after, key=after.__getitem__)
        print(f"{label:8} slowest at {big:,}: {worst} {after[worst]:.1f} ms", flush=True)
    finally:
        await db.close()


async def fill(db: Database, start: int, stop: int, total: int, rng: random.Random) -> None:
    """Jobs ``start`` to ``stop`` of ``total``, oldest first (ascending ``seq``), their
    submission times spread over the month before ``_END``."""
    for low in range(start, stop, CHUNK):
        rows = [_row(i, total, rng) for i in range(low, min(stop, low + CHUNK))]
        async with db.write(ordered_events=False, durable=False) as conn:
            await insert_rows(conn, jobs, rows)


def _row(i: int, total: int, rng: random.Random) -> dict[str, Any]:
    state = _pick(STATES, rng)
    user = rng.randrange(USERS)
    kind = JobKind.SAMPLE if rng.random() < 0.8 else rng.choice([JobKind.CUSTOM, JobKind.TRAIN])
    submitted = _END - MONTH_S * (1 - i / total)
    job = Job(
        id=f"job_{i:08x}{rng.getrandbits(48):012x}",
        kind=kind,
        priority=rng.choice(["interactive", "paid", "free", "batch"]),
        team=TEAMS[user % len(TEAMS)],
        user=f"u{user}",
        model=_pick(MODELS, rng) if kind is JobKind.SAMPLE else None,
        payload={"prompt": "a lighthouse at dusk, oil painting " * 3, "steps": 30, "seed": i},
        submitted_at=submitted,
        state=state,
    )
    ended = state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    return job_row(JobRecord(job)) | {
        "node": None if state is JobState.QUEUED else f"n{rng.randrange(NODES)}",
        "finished_at": submitted + rng.uniform(5, 600) if ended else None,
    }


def _pick(shares: list[tuple[Any, float]], rng: random.Random) -> Any:
    x = rng.random()
    for value, share in shares:
        x -= share
        if x < 0:
            return value
    return shares[-1][0]


async def timed(db: Database, case: Case, size: int, repeat: int) -> float:
    """Median milliseconds of one page of ``case`` (one warm-up run first)."""
    where = case.where(size)
    before = await _middle_seq(db) if case.deep else None
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        async with db.read() as conn:
            await job_search.page(conn, where, before_seq=before, limit=PAGE + 1)
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times[1:])


async def _middle_seq(db: Database) -> int:
    async with db.read() as conn:
        top = (await conn.execute(sa.select(sa.func.max(jobs.c.seq)))).scalar() or 0
    return int(top) // 2


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


if __name__ == "__main__":
    sys.exit(main())
