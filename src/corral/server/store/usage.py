"""What a team holds: its queued jobs and the bytes of its jobs' results (quotas).

Result sizes live in each job's ``result`` JSON list, so they are summed by
the database with its JSON functions, which the two databases name
differently; the rest of each statement is the same. The sum is read in
pages of ``PAGE`` jobs: on SQLite statements run on the event loop, and one
page is a short pause where a team's whole history would be a long one.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.states import JobState
from corral.server.store.tables import jobs

PAGE = 2000
"""Jobs summed per statement: about a millisecond of SQLite's time."""

# One page of a team's jobs after a seq: how many, the last seq, the bytes of their results.
_PAGE_SQL = """
WITH page AS (
    SELECT seq, result FROM jobs WHERE team = :team AND seq > :after ORDER BY seq LIMIT :n
)
SELECT (SELECT count(*) FROM page), (SELECT max(seq) FROM page), ({total})
"""
_RESULT_BYTES = {
    # A JSON null (a job without results) has no array elements to sum.
    "sqlite": "SELECT coalesce(sum(json_extract(f.value, '$.size')), 0) "
    "FROM page, json_each(page.result) AS f WHERE json_type(page.result) = 'array'",
    "postgresql": "SELECT coalesce(sum((f ->> 'size')::bigint), 0) FROM page, "
    "json_array_elements(CASE WHEN json_typeof(page.result) = 'array' "
    "THEN page.result ELSE '[]'::json END) AS f",
}


async def queued_jobs(conn: AsyncConnection, team: str) -> int:
    """How many of ``team``'s jobs wait in the queue, or wait for others to enter it (a
    pipeline's later steps count: they hold a place as surely as queued jobs do)."""
    waiting = (JobState.QUEUED.value, JobState.WAITING.value)
    query = sa.select(sa.func.count()).where(jobs.c.team == team, jobs.c.state.in_(waiting))
    return int((await conn.execute(query)).scalar() or 0)


async def result_bytes_page(conn: AsyncConnection, team: str, after: int) -> tuple[int, int, int]:
    """The bytes of the results of ``team``'s next ``PAGE`` jobs after seq ``after``:
    (jobs read, the last one's seq, bytes). Fewer than ``PAGE`` jobs read: the last page."""
    total = _RESULT_BYTES[conn.dialect.name]
    statement = sa.text(_PAGE_SQL.format(total=total))
    row = (await conn.execute(statement, {"team": team, "after": after, "n": PAGE})).one()
    count, last, size = row
    return int(count), int(last or after), int(size or 0)
