"""SSE readers served from the events this process committed last (SQLite), else the table."""

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
    if world.plane.rt.db.is_postgres:
        assert in_memory is None, "other replicas write events too: always the table"
    else:
        assert [e for e, _ in in_memory or []] == table
