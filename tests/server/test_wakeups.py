"""The loop's wake-ups (``Wakeups`` for SSE readers, ``Trigger`` for the scheduling loop).

A cancel that lands in the same loop turn as the wake-up must still cancel
the waiter: with Python 3.11's ``asyncio.wait_for`` the wake-up won and the
cancel was lost, so a stopping server could wait forever for a reader or
for the scheduling loop (the agent link had the same bug: docs/agent-link.md).

An SSE reader is woken only by what it would read: a job's stream by that
job's events, the all-events stream by events of its kinds and team. Every
commit used to wake every stream, and each job's stream then read its job's
row: many clients waiting on their jobs made every commit cost a read each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from server_harness import ADMIN, World

from corral.core.events import Event, EventKind
from corral.server.services.feed import EventFeed
from corral.server.services.wakeups import Trigger, Wakeups
from corral.server.store.events import TeamEvent

pytestmark = pytest.mark.anyio


def _event(kind: EventKind, job_id: str | None = "job_a", team: str | None = "t1") -> TeamEvent:
    return TeamEvent(Event(kind, 1.0, job_id), team)


async def _cancel_as_it_wakes(wait: Coroutine[Any, Any, bool], wake: Callable[[], None]) -> None:
    task = asyncio.create_task(wait)
    await asyncio.sleep(0)  # the task now waits
    wake()  # its wake-up is scheduled first ...
    task.cancel()  # ... the cancel right behind it, in the same turn
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled(), "the waiter ended cancelled, not woken"


async def test_a_cancel_racing_a_wake_up_is_not_lost() -> None:
    wakeups = Wakeups()
    ticket = wakeups.ticket(job_id="job_a")
    await _cancel_as_it_wakes(
        wakeups.wait(ticket, 10.0), lambda: wakeups.publish([_event(EventKind.JOB_LOG)])
    )
    assert wakeups.waiting == 0


async def test_a_cancel_racing_a_trigger_is_not_lost() -> None:
    """Neither is lost: the waiter ends cancelled, and the poke stays for the next wait
    (a stopping server stops its loop; a restarted loop still sees the work)."""
    trigger = Trigger()
    await _cancel_as_it_wakes(trigger.wait(10.0), trigger.fire)
    assert trigger.fired, "the poke outlives the cancelled waiter"
    assert await trigger.wait(0.0) is True, "the next wait returns at once"


async def test_waits_end_on_the_wake_up_or_the_timeout() -> None:
    wakeups, trigger = Wakeups(), Trigger()
    ticket = wakeups.ticket()
    assert await wakeups.wait(ticket, 0.01) is False
    assert wakeups.waiting == 0, "a wait that timed out leaves nothing registered"
    ticket = wakeups.ticket()
    wakeups.publish([_event(EventKind.JOB_SUBMITTED)])
    assert await wakeups.wait(ticket, 10.0) is True, "a publication before the wait is not lost"
    assert await trigger.wait(0.01) is False
    trigger.fire()
    assert await trigger.wait(10.0) is True
    assert trigger.fired, "waiting does not clear it"


def test_a_job_stream_is_woken_by_its_own_job_only() -> None:
    wakeups = Wakeups()
    mine, other = wakeups.ticket(job_id="job_a"), wakeups.ticket(job_id="job_b")
    wakeups.publish([_event(EventKind.JOB_SUBMITTED, "job_c"), _event(EventKind.NODE_JOINED, None)])
    assert not mine.woken.is_set()
    assert not other.woken.is_set()
    wakeups.publish([_event(EventKind.JOB_LOG, "job_a")])  # any kind: its end may be any
    assert mine.woken.is_set()
    assert not other.woken.is_set()
    assert wakeups.waiting == 1


def test_the_all_events_stream_is_woken_by_events_it_would_send() -> None:
    wakeups = Wakeups()
    ends = frozenset({"job.succeeded", "job.failed"})
    admin_ends = wakeups.ticket(kinds=ends)
    team_any = wakeups.ticket(team="t2")
    everything = wakeups.ticket()
    wakeups.publish([_event(EventKind.JOB_PLACED, team="t1")])
    assert everything.woken.is_set()
    assert not admin_ends.woken.is_set(), "not a kind it sends"
    assert not team_any.woken.is_set(), "another team's event"
    wakeups.publish([_event(EventKind.JOB_LOG, team="t2"), _event(EventKind.JOB_SUCCEEDED)])
    assert admin_ends.woken.is_set()
    assert team_any.woken.is_set()
    assert wakeups.waiting == 0


def test_forget_is_idempotent_and_leaves_the_others() -> None:
    wakeups = Wakeups()
    tickets = [wakeups.ticket(job_id="job_a"), wakeups.ticket(job_id="job_a"), wakeups.ticket()]
    wakeups.forget(tickets[0])
    wakeups.forget(tickets[0])
    assert wakeups.waiting == 2
    wakeups.publish([_event(EventKind.JOB_LOG, "job_a")])
    assert tickets[1].woken.is_set()
    assert tickets[2].woken.is_set(), "the all-events stream sends job.log too"
    assert wakeups.waiting == 0


async def test_streams_of_waiting_jobs_sleep_through_other_jobs_commits(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's ``Job.wait`` follows one stream per job: other jobs' commits must not make
    each such stream wake and read its job's row (that was a read per waiter per commit)."""
    reads: list[str] = []
    ended = EventFeed._ended

    async def counted(self: EventFeed, job_id: str) -> bool:
        reads.append(job_id)
        return await ended(self, job_id)

    monkeypatch.setattr(EventFeed, "_ended", counted)
    waiting = [(await world.submit()).job.id for _ in range(5)]  # no agent: they stay queued
    streams = [world.plane.feed.follow(ADMIN, 0, job_id=j) for j in waiting]
    followers = [asyncio.create_task(_drain(s)) for s in streams]
    # each reads its events once and then waits (on a loaded machine that takes a while)
    await _until(lambda: world.plane.rt.wakeups.waiting == len(waiting))
    assert len(reads) == len(waiting)

    for _ in range(10):
        await world.submit()
    await asyncio.sleep(0.05)
    assert len(reads) == len(waiting), "other jobs' commits woke the waiting streams"

    await world.plane.jobs.cancel(ADMIN, waiting[0])  # its own end wakes it, and it ends
    await asyncio.wait_for(followers[0], 5.0)
    assert followers[0].result()[-1] == "job.cancelled"
    assert all(not f.done() for f in followers[1:])
    for f in followers[1:]:
        f.cancel()
    await asyncio.gather(*followers[1:], return_exceptions=True)
    assert world.plane.rt.wakeups.waiting == 0, "a reader that went away leaves nothing behind"


async def _until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``done()`` holds, checking every few milliseconds; fail past ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        assert loop.time() < deadline, f"still not so after {timeout} s"
        await asyncio.sleep(0.005)


async def _drain(stream: Any) -> list[str]:
    kinds: list[str] = []
    async for batch in stream:
        kinds += [e.kind.value for e in batch or []]
    return kinds
