"""SSE readers served from the events this process committed last, else the table (on
PostgreSQL only runs of numbers without a gap: other replicas write events too)."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.events import Event, EventKind
from corral.server.services.feed import one_by_one
from corral.server.services.recent import RecentEvents
from corral.server.store import events as event_repo
from corral.server.store.events import TeamEvent

pytestmark = pytest.mark.anyio


def _batch(*teams: str | None) -> list[TeamEvent]:
    return [TeamEvent(Event(EventKind.JOB_LOG, 1.0, f"job_{i}"), t) for i, t in enumerate(teams)]


def test_a_reader_inside_the_window_is_served_from_memory_with_filters() -> None:
    recent = RecentEvents()
    assert recent.after(0) is None, "nothing committed yet: read the table"
    recent.add(_batch("a", "b", "a"), [11, 12, 13])

    assert [e.seq for e, _ in recent.after(10) or []] == [11, 12, 13]
    assert [e.seq for e, _ in recent.after(11, team="a") or []] == [13]
    assert [e.seq for e, _ in recent.after(10, job_id="job_1") or []] == [12]
    assert [e.seq for e, _ in recent.after(10, limit=2) or []] == [11, 12]
    assert recent.after(13) == []
    assert recent.after(9) is None, "event 10 may exist and is not kept: read the table"


def test_events_falling_out_of_the_window_send_slow_readers_to_the_table() -> None:
    recent = RecentEvents(max_kept=3)
    recent.add(_batch(None, None), [1, 2])
    recent.add(_batch(None, None), [3, 4])

    assert recent.after(0) is None, "event 1 fell out"
    assert [e.seq for e, _ in recent.after(1) or []] == [2, 3, 4]


def test_a_batch_without_seqs_closes_the_window() -> None:
    recent = RecentEvents()
    recent.add(_batch(None), [5])
    recent.add(_batch(None), [])
    assert recent.after(5) is None


async def test_the_feed_from_memory_equals_the_table(world: World) -> None:
    for _ in range(3):
        await world.submit()
    from_feed: list[Event] = []
    async for event in one_by_one(world.plane.feed.follow(ADMIN, 0)):
        if event is None or len(from_feed) == 3:
            break
        from_feed.append(event)
        if len(from_feed) == 3:
            break
    async with world.plane.rt.db.read() as conn:
        table = [e for e, _ in await event_repo.after(conn, 0)]
    assert from_feed == table[:3]
    in_memory = world.plane.rt.recent.after(table[0].seq - 1)  # from the first one on
    assert [e for e, _ in in_memory or []] == table


def test_with_other_writers_only_a_gapless_run_after_the_reader_is_served() -> None:
    recent = RecentEvents(contiguous=True)
    recent.add(_batch("a", "b"), [11, 12])
    recent.add(_batch("a"), [14])  # 13: another replica's, or a number never used
    recent.add(_batch("a", "b"), [15, 16])

    assert [e.seq for e, _ in recent.after(13) or []] == [14, 15, 16], "13 is read: 14 is next"
    assert [e.seq for e, _ in recent.after(14, team="a") or []] == [15]
    assert recent.after(14, team="c") == [], "every number after 14 is kept: none is c's"
    # Up to the gap would be true, but the reader would then wait for news of what is
    # committed already (14-16 woke nobody since): the table gives it everything at once.
    assert recent.after(10) is None
    assert recent.after(11) is None
    assert recent.after(12) is None, "13 is not kept: the table says what it was"
    assert recent.after(16) is None, "nothing kept after it: others may have written since"
    assert recent.after(17) is None


@pytest.mark.postgres
async def test_on_postgresql_another_replica_s_event_reaches_the_reader_from_the_table(
    pg_world: World,
) -> None:
    """A reader whose next event another replica wrote is sent to the table for it."""
    world = pg_world
    await world.submit()
    async with world.plane.rt.db.read() as conn:
        read = max(e.seq for e, _ in await event_repo.after(conn, 0))
    async with world.plane.rt.db.write() as conn:  # as another replica: memory never sees it
        await event_repo.append(conn, [TeamEvent(Event(EventKind.JOB_LOG, 2.0, "elsewhere"))])
    second = await world.submit()
    assert world.plane.rt.recent.after(read) is None, "the next number is not kept"
    seen: list[str | None] = []
    async for event in one_by_one(world.plane.feed.follow(ADMIN, read)):
        if event is None:
            break
        seen.append(event.job_id)
        if event.job_id == second.job.id:
            break
    assert seen == ["elsewhere", second.job.id]
